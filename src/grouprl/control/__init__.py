"""Classic control (``grouprl rl``, needs ``grouprl[rl]``): gymnasium environments, small MLP policies and GRPO,
PPO, TRPO and VPG on the math core shared with the language-model trainers."""

from grouprl.control.algorithm_registry import ALGORITHMS
from grouprl.control.base import ControlAlgorithm
from grouprl.control.batch import EnvBatch
from grouprl.control.config import (
    ControlConfig,
    GRPOControlConfig,
    PPOControlConfig,
    TRPOControlConfig,
    VPGControlConfig,
)
from grouprl.control.critic_fit import CRITIC_ADVANTAGES, critic_advantages, fit_critic
from grouprl.control.eval_episodes import eval_seeds, evaluate_policy
from grouprl.control.grpo import ControlGRPO
from grouprl.control.policies import POLICIES, Agent, CategoricalPolicy, GaussianPolicy, Policy, ValueNet, make_policy
from grouprl.control.ppo import ControlPPO
from grouprl.control.rollout import SegmentCollector, Trajectories, run_episodes
from grouprl.control.trpo import ControlTRPO
from grouprl.control.vpg import ControlVPG

__all__ = [
    "ALGORITHMS", "CRITIC_ADVANTAGES", "POLICIES",
    "Agent", "CategoricalPolicy", "ControlAlgorithm", "ControlConfig", "ControlGRPO", "ControlPPO", "ControlTRPO",
    "ControlVPG", "EnvBatch", "GRPOControlConfig", "GaussianPolicy", "PPOControlConfig", "Policy",
    "SegmentCollector", "TRPOControlConfig", "Trajectories", "VPGControlConfig", "ValueNet",
    "critic_advantages", "eval_seeds", "evaluate_policy", "fit_critic", "make_policy", "run_episodes",
]
