"""What the trainer's settings resolve to (formats, importance correction, batch shape, the passes a step needs,
empty algorithm-dependent keys); :class:`~grouprl.trainer.config.TrainerConfig` takes these as its methods."""

from __future__ import annotations

from typing import Any


# Imported when asked: the config class imports neither torch nor the trainer.
def _algorithm(name: str) -> Any:
    from grouprl.trainer.algorithms import ALGORITHMS

    return ALGORITHMS.get(name)


def _format(name: str) -> Any:
    from grouprl.rollout.formats import FORMATS

    return FORMATS.get(name)


class ResolvedSettings:
    """Derived values of a :class:`~grouprl.trainer.config.TrainerConfig` (read its fields)."""

    @property
    def rollout_format(self) -> str:
        """``rollout_dtype``, or ``dtype``'s where it is auto."""
        return self.rollout_dtype if self.rollout_dtype != "auto" else "bf16" if self.dtype == "bf16" else "fp32"

    @property
    def rollout_bf16(self) -> bool:
        import torch

        return _format(self.rollout_format).copy_dtype is torch.bfloat16

    @property
    def train_bf16(self) -> bool:
        return self.dtype == "bf16"

    @property
    def reference_bf16(self) -> bool:
        return self.ref_dtype == "bf16" or (self.ref_dtype == "auto" and self.dtype == "bf16")

    @property
    def checkpointing(self) -> bool:
        """``gradient_checkpointing`` with empty resolved: on, except for a trust-region update."""
        if self.gradient_checkpointing is not None:
            return self.gradient_checkpointing
        return _algorithm(self.algo).update != "trust-region"

    @property
    def rollout_is_level(self) -> str:
        """``rollout_is`` with auto resolved (:func:`rollout_is_for`) as for ``rollout_engine``."""
        return rollout_is_for(self, own_weights=self.rollout_engine == "vllm")

    @property
    def rollout_rows(self) -> int:
        """B = P * G."""
        return self.prompts_per_step * self.group_size

    @property
    def minibatch_rows(self) -> int:
        return self.minibatch_size or self.rollout_rows

    @property
    def off_policy(self) -> bool:
        """True when some update uses a policy that already moved: old log-probs are needed."""
        return self.mu > 1 or self.minibatch_rows < self.rollout_rows

    @property
    def needs_reference(self) -> bool:
        return self.beta > 0

    @property
    def needs_old_logprobs(self) -> bool:
        """Off-policy ratios, a KL reward penalty or rollout importance weights need a pass before the update."""
        return self.off_policy or self.kl_penalty_in_reward or (self.rollout_is_level != "none"
                                                               and not self.rollout_is_in_update)

    @property
    def rollout_is_in_update(self) -> bool:
        """On-policy, the clipped update's own (detached) pass gives pi_old for the rollout importance weights."""
        return (self.rollout_is_level != "none" and not self.off_policy and not self.kl_penalty_in_reward
                and _algorithm(self.algo).update == "clipped")

    # -- empty algorithm-dependent keys (the field keeps what the user wrote, so another algo gets its defaults) --
    @property
    def advantage_estimator(self) -> str:
        return self.advantage or _algorithm(self.algo).advantage

    @property
    def kl_penalty_in_reward(self) -> bool:
        """``kl_in_reward``, or the algorithm's own placement when it is empty (never without a KL)."""
        own = _algorithm(self.algo).kl_in_reward
        return bool(self.beta > 0 and (own if self.kl_in_reward is None else self.kl_in_reward))

    @property
    def kl_controller_name(self) -> str:
        return self.kl_controller or _algorithm(self.algo).kl_controller


def rollout_is_for(config: ResolvedSettings, own_weights: bool) -> str:
    """``rollout_is`` with auto resolved: only fp32 on both sides through the live module computes the trainer's
    own numbers, so only that pairing goes uncorrected."""
    if config.rollout_is != "auto":
        return config.rollout_is
    exact = not own_weights and _format(config.rollout_format).exact and not config.train_bf16
    return "none" if exact else "token"
