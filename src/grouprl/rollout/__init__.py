"""Generation for GRPO, knowing nothing of advantages or losses: the built-in engine (:mod:`.sampler`, decode loops
in :mod:`.decoding`, :mod:`.beams`, :mod:`.turns`), per-token log-probs shared with the trainer (:mod:`.logprobs`),
rollout formats (:mod:`.formats`, CPU paths in :mod:`.cpu`), vLLM (:mod:`.vllm`) and scratch folders that go with
their process (:mod:`.scratch`).
"""
