"""The language-model algorithms by name (``--algo``, ``grouprl compare``, the Python API). All run the same
step; each differs by data: where the advantage comes from, its update rule
(:data:`grouprl.trainer.rules.UPDATE_RULES`), its defaults for shared keys, and the keys it owns."""

from __future__ import annotations

from dataclasses import dataclass

from grouprl.algos import AdaptiveKLController, FixedKLController
from grouprl.registry import Registry

KEY_GROUPS: dict[str, tuple[str, ...]] = {
    "critic": ("gamma", "gae_lambda", "whiten_advantages", "vf_coef", "vf_clip", "critic_model", "critic_lr",
               "critic_warmup_steps"),
    "trust-region": ("max_kl", "damping", "cg_iters", "backtracks", "accept_ratio", "fisher_stride"),
}
"""Keys of a part only some algorithms have, refused under the others (a shared key left unused is accepted)."""


@dataclass(frozen=True)
class Algorithm:
    """One language-model algorithm: its update rule, the :data:`KEY_GROUPS` it ``owns``, a ``critic``, and the
    defaults of its empty keys (``defines_advantage``: the estimator makes the algorithm, so it may not differ)."""

    update: str
    owns: tuple[str, ...] = ()
    critic: bool = False
    advantage: str = "grpo"
    defines_advantage: bool = False
    kl_in_reward: bool = False
    kl_controller: str = "fixed"

    @property
    def keys(self) -> frozenset[str]:
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


KL_CONTROLLERS: Registry = Registry("KL controller")  # name -> fn(config) -> controller: beta, update(kl, n), state
KL_CONTROLLERS.register("fixed", lambda c: FixedKLController(c.beta))
KL_CONTROLLERS.register("adaptive", lambda c: AdaptiveKLController(c.beta, c.kl_target, c.kl_horizon))
