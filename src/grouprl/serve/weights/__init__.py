"""How weights travel: safetensors folders (:mod:`.transport`, :mod:`.stream_write`) or a broadcast (:mod:`.sent`)."""
