"""The trainer's process component across the processes of a torchrun run: N processes on P/N
prompts each take exactly the step one process takes on all P prompts.

- prompts: every process walks the same seeded prompt stream and takes its own contiguous slice of
  each step's prompts; groups never straddle processes, and each row's draws depend on its place in
  the whole batch (:mod:`grouprl.run.seed_streams`), not on the process;
- rollout: under FSDP the whole policy is gathered once per rollout
  (:func:`~grouprl.trainer.dist.sharding.gathered_weights`); a sampler with its own weights (vLLM) gets
  them pushed at the start of the rollout (its ``phase()``); rollout servers get them from process 0
  alone, and every process waits for that push (:mod:`grouprl.serve.client.ranks`);
- rewards: computed where the rows were generated; a reward function that raises in one process stops
  every process with that error;
- advantages: per group, locally; with ``advantage_scale=batch`` the batch std's sums are all-reduced;
- loss: each minibatch's denominators are summed over processes and the processes' gradients added, so
  the update is the one-process update on the whole batch;
- logs: gathered with object collectives; process 0 alone writes them; evaluation splits the held-out
  prompts between the processes;
- checkpoints: sharded for resuming with the same number of processes, plus the policy gathered into
  ``model/`` (:mod:`grouprl.trainer.dist.checkpoint`).

With several minibatches per step each minibatch takes ``minibatch_size / N`` rows from each process,
so the update equals the one-process update in distribution, not draw for draw (one minibatch, the
default, is exact)."""

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
"""Metric prefixes added up over processes: each process's loss is its share of the batch loss,
throughputs add, and so do the groups a judge dropped (each process judges its own). ``time/`` takes the slowest
process; the rest is a mean weighted by each process's tokens in the loss."""


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
    """:class:`grouprl.trainer.one_process.OneProcess`'s interface over torch.distributed.

    Args:
        env: this process's place (from :func:`~grouprl.trainer.dist.group.init_distributed`).
        config: the trainer config (``engine``, ``mixed_precision``, ``cpu_offload``).
    """

    def __init__(self, env: DistEnv, config: TrainerConfig):
        for msg in world_size_problems(config, env.world_size):
            raise ValueError(msg)
        self.env = env
        self.rank, self.world_size, self.is_main, self.device = env.rank, env.world_size, env.is_main, env.device
        self.sharding = Sharding(config.engine, config.mixed_precision, config.cpu_offload)

    def place(self, policy: nn.Module, reference: nn.Module | None) -> tuple[nn.Module, nn.Module | None]:
        # On the device first, so the broadcast runs over NCCL on GPUs; then process 0's weights
        # everywhere: random parts (LoRA adapters, a randomly initialised model) must agree.
        broadcast_module(policy.to(self.env.device))
        if reference is not None:
            broadcast_module(reference.to(self.env.device))
            reference = self.sharding.frozen(reference, self.env)
        return self.sharding.trainable(policy, self.env), reference

    def forward_model(self, model: nn.Module) -> nn.Module:
        # The whole forward: FSDP's gathers and DDP's gradient hooks fire on it, not on the decoder
        # body and LM head called apart (the cost: logits of every position, not chunks).
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
        # DDP and FSDP average gradients over processes; each process's loss is its share of the
        # batch loss, so scaling by their number makes the result the gradient of the whole batch.
        return float(self.world_size)

    @contextlib.contextmanager
    def rollout(self, sampler: RolloutEngine, policy: nn.Module, ahead: bool = False) -> Iterator[None]:
        """Around a rollout or an evaluation (every process enters together): the policy gathered for
        a sampler that runs the live model, or the weights pushed into one that keeps its own copy; nothing
        for a step's batch sampled ahead (``ahead``: the rollout threads pushed before sampling it)."""
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
