"""How weights travel from the trainer to rollout servers, read by both sides: safetensors folders written one tensor
at a time (:mod:`.transport`, :mod:`.stream_write`), or a broadcast (:mod:`.sent`: what is sent; :mod:`.gloo`: vLLM's
weight-transfer protocol over TCP for CPU servers)."""
