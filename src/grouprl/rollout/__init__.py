"""Generation for GRPO: G completions per prompt, beam groups, and per-token log-probs.

- :mod:`grouprl.rollout.sampler` -- :class:`~grouprl.rollout.sampler.Sampler`, the engine
  (batched KV-cache decoding, shared prefill, finished rows dropped, stop strings).
- :mod:`grouprl.rollout.beams` -- ``mode="beam"``: the G best beams of each prompt.
- :mod:`grouprl.rollout.logprobs` -- :func:`~grouprl.rollout.logprobs.token_logprobs`, chunked
  over positions, shared with the trainer.
- :mod:`grouprl.rollout.prompts` -- chat-template rendering of user prompts.
- :mod:`grouprl.rollout.formats` -- the rollout formats (fp32, bf16, bf16-weights) and what each needs.
- :mod:`grouprl.rollout.cpu` -- the decode paths that run on a CPU only (layer loop, compiled step,
  bf16-weights products).
- :mod:`grouprl.rollout.scratch` -- temporary folders for engines and servers (model folders, weight pushes)
  that go with their process, a killed one included.

This package knows nothing of advantages or losses.
"""
