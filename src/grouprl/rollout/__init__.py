"""Generation, knowing nothing of advantages or losses: the engine seam (:mod:`.protocol`), the built-in engine
(:mod:`.sampler`, :mod:`.decoding`, :mod:`.beams`, :mod:`.turns`), log-probs (:mod:`.logprobs`), formats
(:mod:`.formats`, :mod:`.cpu`) and vLLM (:mod:`.vllm`)."""
