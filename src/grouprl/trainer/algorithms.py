"""The language-model algorithms by name: what each one is made of and which keys it reads.

Every algorithm runs the same step (:class:`grouprl.trainer.trainer.Trainer`): rollout -> rewards ->
advantages -> update -> metrics. What differs is data here: where the advantage comes from (an
estimator of :data:`grouprl.algos.ADVANTAGES`, or a critic with GAE); the update rule
(:data:`grouprl.trainer.rules.UPDATE_RULES`: clipped-surrogate SGD or a trust-region natural-gradient
step); the defaults it gives shared keys (where the KL penalty goes, whether beta adapts), the keys it
defines (rloo *is* GRPO's update with the leave-one-out estimator), and the keys it owns (PPO's critic,
TRPO's trust region), refused under another algorithm when set. ``grouprl train --algo NAME``,
``grouprl compare`` and the Python API all look algorithms up here."""

from __future__ import annotations

from dataclasses import dataclass

from grouprl.algos import AdaptiveKLController, FixedKLController
from grouprl.registry import Registry

KEY_GROUPS: dict[str, tuple[str, ...]] = {
    "critic": ("gamma", "gae_lambda", "whiten_advantages", "vf_coef", "vf_clip", "critic_model", "critic_lr",
               "critic_warmup_steps"),
    "trust-region": ("max_kl", "damping", "cg_iters", "backtracks", "accept_ratio", "fisher_stride"),
}
"""Keys that belong to one part only some algorithms have: PPO's critic, TRPO's trust region.
(Shared keys that an algorithm leaves unused, such as the optimizer's under trpo, are accepted; their
documentation says who reads them.)"""


@dataclass(frozen=True)
class Algorithm:
    """One language-model algorithm, as the trainer assembles it."""

    update: str
    """Update rule: ``clipped`` (mu passes of minibatch AdamW steps on the clipped surrogate) or
    ``trust-region`` (one natural-gradient step per rollout)."""
    owns: tuple[str, ...] = ()
    """Groups of :data:`KEY_GROUPS` that belong to this algorithm."""
    critic: bool = False
    """A learned value function gives per-token advantages by GAE (the group is then only the
    sampling shape)."""
    advantage: str = "grpo"
    """The group estimator when ``advantage`` is empty."""
    defines_advantage: bool = False
    """The estimator is what makes this algorithm (rloo, reinforce): ``advantage`` may not differ."""
    kl_in_reward: bool = False
    """Where the KL penalty goes when ``kl_in_reward`` is empty (true: into the reward)."""
    kl_controller: str = "fixed"
    """How beta moves when ``kl_controller`` is empty."""

    @property
    def keys(self) -> frozenset[str]:
        """Every key this algorithm owns."""
        return frozenset(k for group in self.owns for k in KEY_GROUPS[group])


ALGORITHMS: Registry[Algorithm] = Registry("algorithm")
ALGORITHMS.register("grpo", Algorithm(update="clipped"))
# REINFORCE and RLOO centre within the group without the std division (their own definitions).
ALGORITHMS.register("reinforce", Algorithm(update="clipped", advantage="reinforce", defines_advantage=True))
ALGORITHMS.register("rloo", Algorithm(update="clipped", advantage="rloo", defines_advantage=True))
ALGORITHMS.register("ppo", Algorithm(update="clipped", owns=("critic",), critic=True, kl_in_reward=True,
                                     kl_controller="adaptive"))
ALGORITHMS.register("trpo", Algorithm(update="trust-region", owns=("trust-region",)))


def owners(key: str) -> list[str]:
    """Names of the algorithms that own ``key`` (empty for a shared key).

    >>> owners("vf_coef"), owners("max_kl")
    (['ppo'], ['trpo'])
    """
    return [name for name in ALGORITHMS if key in ALGORITHMS.get(name).keys]


KL_CONTROLLERS: Registry = Registry("KL controller")
"""name -> ``fn(config) -> controller`` with ``beta``, ``update(kl, n)`` and a state dict."""
KL_CONTROLLERS.register("fixed", lambda c: FixedKLController(c.beta))
KL_CONTROLLERS.register("adaptive", lambda c: AdaptiveKLController(c.beta, c.kl_target, c.kl_horizon))
