"""What the trainer's settings resolve to: the number format of each phase (the trainer replaces ``auto`` by
the formats it decided, :mod:`grouprl.models.precision`), the importance correction, the batch's shape, which
passes a step needs, and what an empty algorithm-dependent key stands for. Kept apart from
:class:`~grouprl.trainer.config.TrainerConfig`, whose fields are the user's knobs and their documentation; the
config class takes these as its methods."""

from __future__ import annotations

from typing import Any


# The registries are imported when a value is asked for: the config class that takes these methods imports
# neither torch nor the trainer.
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
        """The rollouts' format: ``rollout_dtype``, or ``dtype``'s where it is auto (fp32 where both are: a
        trainer's config has them decided)."""
        return self.rollout_dtype if self.rollout_dtype != "auto" else "bf16" if self.dtype == "bf16" else "fp32"

    @property
    def rollout_bf16(self) -> bool:
        """Rollouts sample from bf16 weights."""
        import torch

        return _format(self.rollout_format).copy_dtype is torch.bfloat16

    @property
    def train_bf16(self) -> bool:
        """The training and log-prob passes run under bf16 autocast."""
        return self.dtype == "bf16"

    @property
    def reference_bf16(self) -> bool:
        """The frozen reference copy is stored in bf16."""
        return self.ref_dtype == "bf16" or (self.ref_dtype == "auto" and self.dtype == "bf16")

    @property
    def checkpointing(self) -> bool:
        """``gradient_checkpointing`` with empty resolved: on, except for a trust-region update."""
        if self.gradient_checkpointing is not None:
            return self.gradient_checkpointing
        return _algorithm(self.algo).update != "trust-region"

    @property
    def rollout_is_level(self) -> str:
        """``rollout_is`` with auto resolved (:func:`rollout_is_for`). A trainer's config has it resolved for the
        engine its rollout plan chose; otherwise as for ``rollout_engine`` (auto counting as the built-in one)."""
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
        """A pass for the policy's log-probs before the update is needed: off-policy ratios, a KL
        reward penalty, or rollout importance weights that the update cannot take from its own pass."""
        return self.off_policy or self.kl_penalty_in_reward or (self.rollout_is_level != "none"
                                                               and not self.rollout_is_in_update)

    @property
    def rollout_is_in_update(self) -> bool:
        """The rollout importance weights are formed inside the clipped-surrogate update from its own
        log-probs: on-policy, pi_old is the policy the update's first pass runs, so that pass (detached)
        gives pi_old and no separate pass is needed."""
        return (self.rollout_is_level != "none" and not self.off_policy and not self.kl_penalty_in_reward
                and _algorithm(self.algo).update == "clipped")

    # -- what an empty algorithm-dependent key stands for (the field keeps what the user wrote, so a
    # config copied with another algo gets that algorithm's defaults) --------------------------------
    @property
    def advantage_estimator(self) -> str:
        """``advantage``, or the algorithm's own estimator when it is empty."""
        return self.advantage or _algorithm(self.algo).advantage

    @property
    def kl_penalty_in_reward(self) -> bool:
        """``kl_in_reward``, or the algorithm's own placement when it is empty (never without a KL)."""
        own = _algorithm(self.algo).kl_in_reward
        return bool(self.beta > 0 and (own if self.kl_in_reward is None else self.kl_in_reward))

    @property
    def kl_controller_name(self) -> str:
        """``kl_controller``, or the algorithm's own when it is empty."""
        return self.kl_controller or _algorithm(self.algo).kl_controller


def rollout_is_for(config: ResolvedSettings, own_weights: bool) -> str:
    """``rollout_is`` with auto resolved for an engine that samples from its own copy of the weights
    (``own_weights``) or from the live module: only fp32 on both sides through the live module computes the
    trainer's numbers (a bf16 rollout runs on bf16 weights with a bf16 residual stream, a bf16-weights one on bf16
    copies, a bf16 training pass under autocast on fp32 ones), so only that pairing goes uncorrected."""
    if config.rollout_is != "auto":
        return config.rollout_is
    exact = not own_weights and _format(config.rollout_format).exact and not config.train_bf16
    return "none" if exact else "token"
