"""How weights travel from the trainer to rollout servers: safetensors folders (:mod:`.transport`,
:mod:`.stream_write`) or a broadcast (:mod:`.sent`, :mod:`.gloo` for CPU servers)."""
