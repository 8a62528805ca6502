"""The trainer's process component across a torchrun run: N processes on P/N prompts each take exactly the
step one process takes on all P prompts.

Each process takes a contiguous slice of whole groups from the same seeded prompt stream, with draws that
depend on a row's place in the whole batch; loss denominators are summed and gradients added over processes;
process 0 writes the logs. With several minibatches each takes ``minibatch_size / N`` rows per process, so
the update equals the one-process one in distribution, not draw for draw."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TYPE_CHECKING

import torch
from torch import nn

from grouprl.rollout.protocol import RolloutEngine
from grouprl.trainer.dist import checkpoint as dckpt
from grouprl.trainer.dist.group import (
    DistEnv,
    broadcast_module,
    gather_objects,
    max_float,
    raise_if_any_failed,
    sum_tensor,
)
from grouprl.trainer.dist.sharding import Sharding, WholeForward, gathered_weights

if TYPE_CHECKING:
    from grouprl.trainer.config import TrainerConfig

SUMMED = ("loss/", "throughput/", "judge/dropped_groups")
"""Metric prefixes added up over processes; ``time/`` takes the slowest, the rest a mean weighted by tokens."""


def world_size_problems(config: TrainerConfig, world_size: int) -> list[str]:
    """What in ``config`` cannot be split over ``world_size`` processes (checked before loading)."""
    if world_size <= 1:
        return []
    out = []
    groups = config.minibatch_rows // config.group_size
    if config.prompts_per_step % world_size or groups % world_size:
        out.append(f"prompts_per_step={config.prompts_per_step} (and the groups of each minibatch, {groups}) must "
                   f"divide evenly over {world_size} processes: each process trains on whole groups")
    if config.dynamic_sampling:
        out.append("dynamic_sampling is not available with several processes (processes would hold different "
                   "numbers of groups); train in one process or set dynamic_sampling false")
    return out + [f"{why}; train it in one process (grpo, rloo and reinforce run on several)"
                  for why in placement_problems(config)]


def placement_problems(config: TrainerConfig) -> list[str]:
    """What in ``config`` :class:`Processes` cannot place (on several processes, or on one GPU)."""
    from grouprl.trainer.algorithms import ALGORITHMS

    algo = ALGORITHMS.get(config.algo)
    out = []
    if algo.critic:
        out.append(f"algo={config.algo} trains a critic, which the process group neither shards nor moves")
    if algo.update != "clipped":
        out.append(f"algo={config.algo}: its natural-gradient step needs whole-model gradient and Fisher-vector "
                   f"products, which are not reduced across processes")
    return out


class Processes:
    """:class:`grouprl.trainer.one_process.OneProcess`'s interface over torch.distributed."""

    def __init__(self, env: DistEnv, config: TrainerConfig):
        for msg in world_size_problems(config, env.world_size):
            raise ValueError(msg)
        self.env = env
        self.rank, self.world_size, self.is_main, self.device = env.rank, env.world_size, env.is_main, env.device
        self.sharding = Sharding(config.engine, config.mixed_precision, config.cpu_offload)

    def place(self, policy: nn.Module, reference: nn.Module | None) -> tuple[nn.Module, nn.Module | None]:
        # Process 0's weights everywhere (random LoRA adapters must agree), on the device for NCCL.
        broadcast_module(policy.to(self.env.device))
        if reference is not None:
            broadcast_module(reference.to(self.env.device))
            reference = self.sharding.frozen(reference, self.env)
        return self.sharding.trainable(policy, self.env), reference

    def forward_model(self, model: nn.Module) -> nn.Module:
        # FSDP's gathers and DDP's hooks fire on the whole forward, not on body and head called apart.
        return WholeForward(model)

    def share(self, count: int) -> tuple[int, int]:
        n, r = self.world_size, self.rank
        return r * count // n, (r + 1) * count // n

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        return sum_tensor(x)

    def gather(self, obj: Any) -> list[Any]:
        return gather_objects(obj)

    def check(self, error: BaseException | None) -> None:
        raise_if_any_failed(error)

    def any(self, flag: bool) -> bool:
        return max_float(float(flag)) > 0

    def loss_scale(self) -> float:
        # DDP and FSDP average gradients; each loss is a share of the batch loss, so this gives the sum.
        return float(self.world_size)

    @contextlib.contextmanager
    def rollout(self, sampler: RolloutEngine, policy: nn.Module, ahead: bool = False) -> Iterator[None]:
        """Around a rollout: the policy gathered for a live-model sampler, else the weights pushed (unless ``ahead``)."""
        if sampler.uses_live_model:
            with gathered_weights(policy):
                yield
        elif ahead:
            yield
        else:
            with sampler.phase():
                yield

    def combine(self, metrics: dict[str, float], tokens: float) -> dict[str, float]:
        """One record for the run from every process's metrics (rules in :data:`SUMMED`)."""
        parts = gather_objects((tokens, metrics))
        out = {}
        for key in metrics:
            values = [(w, m[key]) for w, m in parts if key in m]
            if key.startswith(SUMMED):
                out[key] = sum(v for _, v in values)
            elif key.startswith("time/"):
                out[key] = max(v for _, v in values)
            else:
                total = sum(w for w, _ in values)
                out[key] = (sum(w * v for w, v in values) / total if total > 0
                            else sum(v for _, v in values) / len(values))
        return out

    def save(self, root: Path, step: int, **parts: Any) -> Path:
        return dckpt.save_dist_checkpoint(root, step, env=self.env, **parts)

    def load(self, folder: Path, **parts: Any) -> dict[str, Any]:
        return dckpt.load_dist_checkpoint(folder, env=self.env, **parts)
