"""Experience from an :class:`~grouprl.control.batch.EnvBatch` as ``[B, T]`` right-padded rows with a ``mask``,
the language-model layout, so ``grouprl.algos`` applies unchanged: whole episodes from given seeds
(:func:`run_episodes`) or a fixed number of steps per iteration (:class:`SegmentCollector`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from grouprl.control.batch import EnvBatch
from grouprl.control.policies import Policy


@dataclass
class Trajectories:
    """B trajectory rows of at most T steps; actions ``[B, T]`` long or ``[B, T, A]`` float32."""

    obs: torch.Tensor
    """[B, T, D] float32 observation before each step (0 on padding)."""
    actions: torch.Tensor
    logp: torch.Tensor
    """[B, T] float32 log-prob of each action under the policy that sampled it (0 on padding)."""
    rewards: torch.Tensor
    mask: torch.Tensor
    """[B, T] float32, 1 on real steps."""
    last_obs: torch.Tensor
    """[B, D] float32 observation after the row's last step."""
    cut: torch.Tensor
    """[B] bool: the row ended before its episode terminated, so a critic bootstraps from V(last_obs)."""
    episode_returns: list[float] = field(default_factory=list)
    """Undiscounted returns of the episodes that finished during this collection."""
    episode_lengths: list[int] = field(default_factory=list)
    group_size: int = 1
    """G when rows are groups of episodes from the same reset seed (prompt-major); else 1."""

    @property
    def num_rows(self) -> int:
        return self.mask.shape[0]

    @property
    def env_steps(self) -> int:
        return int(self.mask.sum())

    def row_returns(self) -> torch.Tensor:
        """``[B]`` undiscounted sum of each row's rewards."""
        return (self.rewards * self.mask).sum(-1)

    def flat(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, ...]`` -> ``[n, ...]``: the real steps of ``x`` (n = env_steps), row-major."""
        return x[self.mask.bool()]


def _rows(buffers: dict[str, np.ndarray], env_of_row: np.ndarray, start: np.ndarray, length: np.ndarray,
          last_obs: np.ndarray, cut: np.ndarray) -> dict[str, torch.Tensor]:
    """Gather time-major buffers ``[steps, N, ...]`` into padded rows ``[B, W, ...]``: row b holds steps
    ``start[b] .. start[b] + length[b] - 1`` of environment ``env_of_row[b]``."""
    width = int(length.max()) if len(length) else 0
    offsets = np.arange(width)[None, :]  # [1, W]
    valid = offsets < length[:, None]  # [B, W]
    steps = np.where(valid, start[:, None] + offsets, 0)  # [B, W] time index, 0 where padding
    env = np.broadcast_to(env_of_row[:, None], steps.shape)
    out = {}
    for name, buf in buffers.items():
        picked = buf[steps, env]  # [B, W, ...]
        picked = np.where(valid.reshape(valid.shape + (1,) * (picked.ndim - 2)), picked, 0)
        out[name] = torch.from_numpy(np.ascontiguousarray(picked))
    out["mask"] = torch.from_numpy(valid.astype(np.float32))
    out["last_obs"] = torch.from_numpy(last_obs.astype(np.float32))
    out["cut"] = torch.from_numpy(cut.astype(bool))
    return out


def _act(policy: Policy, obs: np.ndarray, generator: torch.Generator,
         deterministic: bool) -> tuple[np.ndarray, np.ndarray]:
    """Actions and their log-probs for observations ``[k, D]`` (log-prob 0 when greedy)."""
    with torch.no_grad():
        x = torch.from_numpy(obs)
        if deterministic:
            actions = policy.mode(x)
            return actions.numpy(), np.zeros(len(obs), dtype=np.float32)
        actions, logp = policy.sample(x, generator)
    return actions.numpy(), logp.numpy().astype(np.float32)


def run_episodes(envs: EnvBatch, policy: Policy, seeds: Sequence[int], generator: torch.Generator,
                 deterministic: bool = False, group_size: int = 1) -> Trajectories:
    """One whole episode per seed: row i is ``seeds[i]``'s, ``cut[i]`` True where the time limit ended it."""
    n = len(seeds)
    if n > len(envs):
        raise ValueError(f"{n} episodes need {n} environments, the batch has {len(envs)}")
    obs = envs.reset(range(n), seeds)
    alive = np.arange(n)
    steps: dict[str, list[np.ndarray]] = {"obs": [], "actions": [], "logp": [], "rewards": []}
    lengths, truncated = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
    last_obs = obs.copy()
    while len(alive):
        actions, logp = _act(policy, obs[alive], generator, deterministic)
        next_obs, rewards, term, trunc = envs.step(alive, actions)
        # Time-major buffers hold every environment; dead ones keep zeros and are masked out.
        for name, values in (("obs", obs[alive]), ("actions", actions), ("logp", logp), ("rewards", rewards)):
            full = np.zeros((n, *values.shape[1:]), dtype=values.dtype)
            full[alive] = values
            steps[name].append(full)
        lengths[alive] += 1
        obs[alive] = next_obs
        done = term | trunc
        truncated[alive[done]] = trunc[done] & ~term[done]
        last_obs[alive[done]] = next_obs[done]
        alive = alive[~done]
    buffers = {k: np.stack(v) for k, v in steps.items()}  # [steps, n, ...]
    rows = _rows(buffers, np.arange(n), np.zeros(n, dtype=np.int64), lengths, last_obs, truncated)
    returns = rows["rewards"].sum(-1).tolist()
    return Trajectories(**rows, episode_returns=returns, episode_lengths=lengths.tolist(), group_size=group_size)


class SegmentCollector:
    """``steps_per_env`` steps of each environment per :meth:`collect`; running episodes continue in a new row."""

    def __init__(self, envs: EnvBatch, seed: int):
        self.envs = envs
        self.seeds = np.random.default_rng(seed)
        n = len(envs)
        self.obs = envs.reset(range(n), self._draw(n))
        self.running_return = np.zeros(n, dtype=np.float64)
        self.running_length = np.zeros(n, dtype=np.int64)

    def _draw(self, k: int) -> list[int]:
        return self.seeds.integers(0, 2**31 - 1, size=k).tolist()

    def collect(self, policy: Policy, steps_per_env: int, generator: torch.Generator) -> Trajectories:
        n, everyone = len(self.envs), np.arange(len(self.envs))
        steps: dict[str, list[np.ndarray]] = {"obs": [], "actions": [], "logp": [], "rewards": []}
        ends: list[tuple[int, int, np.ndarray, bool]] = []  # (env, last step index, obs after it, cut)
        returns, lengths = [], []
        for t in range(steps_per_env):
            actions, logp = _act(policy, self.obs, generator, deterministic=False)
            next_obs, rewards, term, trunc = self.envs.step(everyone, actions)
            for name, values in (("obs", self.obs), ("actions", actions), ("logp", logp), ("rewards", rewards)):
                steps[name].append(values)
            self.running_return += rewards
            self.running_length += 1
            done = np.nonzero(term | trunc)[0]
            for i in done:
                ends.append((int(i), t, next_obs[i].copy(), bool(trunc[i] and not term[i])))
                returns.append(float(self.running_return[i]))
                lengths.append(int(self.running_length[i]))
            self.running_return[done] = 0.0
            self.running_length[done] = 0
            if len(done):
                next_obs[done] = self.envs.reset(done, self._draw(len(done)))
            self.obs = next_obs
        for i in range(n):  # the window closes every episode still running: cut, to be bootstrapped
            ends.append((i, steps_per_env - 1, self.obs[i].copy(), True))
        ends.sort(key=lambda e: (e[0], e[1]))
        env_of_row = np.array([e[0] for e in ends])
        last = np.array([e[1] for e in ends])
        first = np.where(np.r_[True, env_of_row[1:] != env_of_row[:-1]], 0, np.r_[0, last[:-1] + 1])
        keep = last >= first  # an episode ending on the window's last step leaves an empty tail piece
        buffers = {k: np.stack(v) for k, v in steps.items()}  # [steps_per_env, N, ...]
        rows = _rows(buffers, env_of_row[keep], first[keep], (last - first + 1)[keep],
                     np.stack([e[2] for e in ends])[keep], np.array([e[3] for e in ends])[keep])
        return Trajectories(**rows, episode_returns=returns, episode_lengths=lengths)
