"""Classic control: gymnasium environments, small MLP policies, batched rollouts and the four
algorithms (GRPO, PPO, TRPO, VPG) on the math core shared with the language-model trainers.

Needs ``gymnasium`` (``pip install 'grouprl[rl]'``). The run folder, metrics and report come from
:class:`grouprl.trainer.control.ControlTrainer` (``grouprl rl``).
"""

from grouprl.envs.algorithms import ALGORITHMS
from grouprl.envs.base import ControlAlgorithm
from grouprl.envs.batch import EnvBatch
from grouprl.envs.config import (
    ControlConfig,
    GRPOControlConfig,
    PPOControlConfig,
    TRPOControlConfig,
    VPGControlConfig,
)
from grouprl.envs.critic import CRITIC_ADVANTAGES, critic_advantages, fit_critic
from grouprl.envs.evaluate import eval_seeds, evaluate_policy
from grouprl.envs.grpo import ControlGRPO
from grouprl.envs.policies import POLICIES, Agent, CategoricalPolicy, GaussianPolicy, Policy, ValueNet, make_policy
from grouprl.envs.ppo import ControlPPO
from grouprl.envs.rollout import SegmentCollector, Trajectories, run_episodes
from grouprl.envs.trpo import ControlTRPO
from grouprl.envs.vpg import ControlVPG

__all__ = [
    "ALGORITHMS", "CRITIC_ADVANTAGES", "POLICIES",
    "Agent", "CategoricalPolicy", "ControlAlgorithm", "ControlConfig", "ControlGRPO", "ControlPPO", "ControlTRPO",
    "ControlVPG", "EnvBatch", "GRPOControlConfig", "GaussianPolicy", "PPOControlConfig", "Policy",
    "SegmentCollector", "TRPOControlConfig", "Trajectories", "VPGControlConfig", "ValueNet",
    "critic_advantages", "eval_seeds", "evaluate_policy", "fit_critic", "make_policy", "run_episodes",
]
