"""N gymnasium environments stepped together, each reset only when told and with the seed given (gymnasium's
vector environments reset with seeds nobody chose; GRPO's groups need one seed each). Continuous actions are
clipped here, so the policy's log-probs stay those of the unclipped sample."""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np

from grouprl.registry import Registry

# space class name -> fn(space, actions [k] or [k, A]) -> env actions
ACTION_CONVERTERS: Registry = Registry("action space")


@ACTION_CONVERTERS.register("Discrete")
def _discrete_actions(space: gym.spaces.Discrete, actions: np.ndarray) -> list:
    return [int(a) + int(space.start) for a in actions]


@ACTION_CONVERTERS.register("Box")
def _box_actions(space: gym.spaces.Box, actions: np.ndarray) -> list:
    clipped = np.clip(actions, space.low, space.high).astype(space.dtype)
    return list(clipped)


class EnvBatch:
    """``n`` copies of gymnasium environment ``env_id``.

    >>> envs = EnvBatch("CartPole-v1", 2)
    >>> envs.reset([0, 1], seeds=[7, 7]).shape  # same seed, same start
    (2, 4)
    """

    def __init__(self, env_id: str, n: int):
        if n < 1:
            raise ValueError(f"an environment batch needs n >= 1 environments, got {n}")
        self.env_id = env_id
        self.envs = [gym.make(env_id) for _ in range(n)]
        self.observation_space = self.envs[0].observation_space
        self.action_space = self.envs[0].action_space
        if not isinstance(self.observation_space, gym.spaces.Box) or len(self.observation_space.shape) != 1:
            raise ValueError(f"{env_id}: only flat Box observation spaces are supported, got {self.observation_space}")
        self._convert = ACTION_CONVERTERS.get(type(self.action_space).__name__)

    def __len__(self) -> int:
        return len(self.envs)

    @property
    def obs_dim(self) -> int:
        return int(self.observation_space.shape[0])

    def reset(self, indices: Sequence[int], seeds: Sequence[int]) -> np.ndarray:
        """Reset environments ``indices`` with ``seeds`` (one each); returns their ``[k, D]`` observations."""
        if len(indices) != len(seeds):
            raise ValueError(f"{len(indices)} environments to reset but {len(seeds)} seeds")
        obs = [self.envs[i].reset(seed=int(s))[0] for i, s in zip(indices, seeds)]
        return np.asarray(obs, dtype=np.float32).reshape(len(indices), self.obs_dim)

    def step(self, indices: Sequence[int],
             actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Step environments ``indices`` with ``actions`` (``[k]`` or ``[k, A]``): ``(next_obs [k, D] float32,
        rewards [k] float32, terminated [k] bool, truncated [k] bool)``."""
        obs, rewards, terminated, truncated = [], [], [], []
        for i, a in zip(indices, self._convert(self.action_space, actions)):
            o, r, term, trunc, _ = self.envs[i].step(a)
            obs.append(o)
            rewards.append(r)
            terminated.append(term)
            truncated.append(trunc)
        return (np.asarray(obs, dtype=np.float32).reshape(len(indices), self.obs_dim),
                np.asarray(rewards, dtype=np.float32), np.asarray(terminated, dtype=bool),
                np.asarray(truncated, dtype=bool))

    def close(self) -> None:
        for env in self.envs:
            env.close()
