"""GRPO on several processes (torchrun): N processes on P/N prompts each take exactly the step one
process takes on all P prompts.

What each process does, and what is shared:

- prompts: every process walks the same seeded prompt stream and takes its own contiguous slice
  of each step's P prompts; groups never straddle processes, so group statistics need no
  communication;
- rollout: sampled with a per-process seed; under FSDP the whole policy is gathered once per
  rollout (:func:`~grouprl.trainer.distributed.gathered_weights`), so rows may stop at different
  lengths in different processes; a sampler with its own copy of the weights (vLLM) gets them
  pushed once at the start of the rollout instead (its ``phase()``);
- rewards: computed where the rows were generated; a reward function that raises in one process
  stops every process with that error (no process is left waiting);
- advantages: per group, locally; with ``advantage_scale=batch`` the batch std is all-reduced;
- loss: each minibatch's denominators (rows, tokens) are summed over processes and the gradients
  of the processes' shares are added up, so the update is the one-process update on the whole
  batch;
- logs: rewards, rollout statistics and sample completions are gathered with object
  collectives; process 0 alone writes metrics, completions, TensorBoard and the summary;
  evaluation splits the held-out prompts between the processes and combines their results;
- checkpoints: sharded for resuming with the same number of processes, plus the policy gathered
  into ``model/`` (see :mod:`grouprl.trainer.dist_checkpoint`).

With several minibatches per step (``minibatch_size`` below the batch) each process shuffles its
own groups and every minibatch takes ``minibatch_size / N`` rows from each process, so the update
equals the one-process update only in distribution, not draw for draw (one minibatch, the default,
is exact). Not supported across processes: dynamic sampling (it would leave processes with
different numbers of groups, and the sharded update needs the same number of micro-batches
everywhere).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from grouprl.algos import compute_advantages
from grouprl.rollout.sampler import Sampler
from grouprl.trainer import checkpoint as ckpt
from grouprl.trainer import dist_checkpoint as dckpt
from grouprl.trainer.distributed import (
    DistEnv,
    Sharding,
    WholeForward,
    broadcast_module,
    gather_objects,
    gathered_weights,
    max_float,
    raise_if_any_failed,
    shard_frozen,
    shard_model,
    sum_floats,
    unwrap,
)
from grouprl.trainer.evaluate import evaluate
from grouprl.trainer.grpo import GRPOTrainer, _mix
from grouprl.trainer.loop import as_plain
from grouprl.trainer.metrics import PhaseTimer, Progress
from grouprl.types import RolloutBatch

SUMMED = ("loss/", "throughput/")
"""Metric prefixes added up over processes: each process's loss is its share of the batch loss,
and throughputs add. ``time/`` takes the slowest process; the rest is a token-weighted mean."""


def world_size_problems(config: Any, world_size: int) -> list[str]:
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
    return out


class _NoLog:
    """The metrics and completions logs of every process but the first: nothing is written."""

    def append(self, records: Any) -> None:
        pass

    def truncate_after(self, step: int) -> None:
        pass

    def records(self) -> list[dict[str, Any]]:
        return []


class _ProcessSeeds:
    """The trainer's sampler with a distinct seed in each process: with one seed everywhere, the
    k-th row of every process would draw the same random numbers."""

    def __init__(self, sampler: Any, rank: int):
        self.sampler, self.rank = sampler, rank

    def generate(self, prompt_ids: list[list[int]], group_size: int, params: Any, *, seed: int | None = None,
                 **kwargs: Any) -> RolloutBatch:
        seed = None if seed is None else _mix(seed, 7919 + self.rank)
        return self.sampler.generate(prompt_ids, group_size, params, seed=seed, **kwargs)

    def update_weights(self, model: torch.nn.Module) -> None:
        self.sampler.update_weights(model)


class DistributedGRPOTrainer(GRPOTrainer):
    """:class:`~grouprl.trainer.grpo.GRPOTrainer` across the processes of a torchrun run.

    Takes the same arguments plus ``env`` (from :func:`~grouprl.trainer.distributed.init_distributed`);
    every process builds it with the same config, data and (unsharded) model. ``config.engine``
    picks FSDP2 or DDP; the reference model is sharded the same way.
    """

    def __init__(self, config: Any, *, env: DistEnv, **kwargs: Any):
        for msg in world_size_problems(config, env.world_size):
            raise ValueError(msg)
        super().__init__(config, **kwargs)
        self.env = env
        self.is_main = env.is_main
        sharding = Sharding(config.engine, config.mixed_precision, config.cpu_offload)
        # On the device first, so the broadcast runs over NCCL on GPUs; then process 0's weights
        # everywhere: random parts (LoRA adapters, a randomly initialised model) must agree.
        broadcast_module(self.policy.to(env.device))
        if self.reference is not None:
            broadcast_module(self.reference.to(env.device))
            self.reference = shard_frozen(self.reference, sharding, env)
        self.policy = shard_model(self.policy, sharding, env)
        self.optimizer, self.scheduler = self.make_optimizer()  # over the sharded parameters
        if isinstance(self.sampler, Sampler):  # decode through the root (FSDP) or the module inside DDP
            self.sampler.update_weights(unwrap(self.policy))
        self.sampler = _ProcessSeeds(self.sampler, env.rank)
        if not env.is_main:
            self.metrics_log = self.completions_log = _NoLog()
        self.step_tokens = 0.0

    # -- data and rollout -------------------------------------------------------------------------
    def take_prompts(self, count: int) -> list[int]:
        share = count // self.env.world_size
        idx = self.stream.take(count)  # every process advances the shared stream by the whole batch
        return idx[self.env.rank * share:(self.env.rank + 1) * share]

    @contextlib.contextmanager
    def rollout_phase(self) -> Iterator[None]:
        """Around a rollout or an evaluation (every process enters together): the policy gathered for
        a sampler that runs the live model, or the weights pushed into one that keeps its own copy."""
        if getattr(self.sampler, "uses_live_model", True):
            with gathered_weights(self.policy):
                yield
        else:
            with self.sampler.phase():
                yield

    def sample_and_score(self, timer: PhaseTimer) -> tuple[RolloutBatch, torch.Tensor, dict, int]:
        result, error = None, None
        with self.rollout_phase():
            try:
                result = super().sample_and_score(timer)
            except Exception as e:  # noqa: BLE001 - re-raised below, in every process
                error = e
        raise_if_any_failed(error)
        return result

    # -- loss -------------------------------------------------------------------------------------
    def logprobs(self, model: torch.nn.Module, batch: RolloutBatch, rows: torch.Tensor | None = None,
                 with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None] | torch.Tensor:
        # The whole forward: FSDP's gathers and DDP's gradient hooks fire on it, not on the decoder
        # body and LM head called apart (the cost: logits of every position, not chunks).
        return super().logprobs(WholeForward(model), batch, rows, with_entropy)

    def advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        c = self.config
        if c.advantage_scale != "batch":
            return super().advantages(rewards)
        # The batch std of the one-process run from sums over processes: centre per group (0 on
        # constant groups and NaN rows), then divide by sqrt(sum of squares / valid rows).
        centred = compute_advantages(c.advantage, rewards, c.group_size, "none", 0.0)
        square_sum, count = sum_floats([float(centred.double().square().sum()), float((~rewards.isnan()).sum())])
        divisor = (square_sum / max(count, 1.0)) ** 0.5 + c.advantage_eps
        return centred / divisor if divisor > 0 else torch.zeros_like(centred)

    def micro_loss(self, batch: RolloutBatch, micro: torch.Tensor, inputs: dict[str, torch.Tensor | None],
                   n_rows: float, n_tokens: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        # This process's loss is its share of the batch loss; DDP and FSDP average gradients over
        # processes, so scaling by their number makes the result the gradient of the whole batch.
        loss, metrics = super().micro_loss(batch, micro, inputs, n_rows, n_tokens)
        return loss * self.env.world_size, metrics

    def minibatch_groups(self) -> int:
        return super().minibatch_groups() // self.env.world_size

    def loss_denominators(self, mask: torch.Tensor) -> tuple[float, float]:
        rows, tokens = sum_floats(super().loss_denominators(mask))
        return rows, tokens

    # -- metrics and logs -------------------------------------------------------------------------
    def step(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        metrics, records = super().step()
        return self.combine_metrics(metrics), records

    def combine_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """One record for the run from every process's metrics (rules in :data:`SUMMED`)."""
        parts = gather_objects((self.step_tokens, metrics))
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

    def reward_metrics(self, rewards: torch.Tensor, per_fn: dict[str, torch.Tensor],
                       constant: torch.Tensor) -> dict[str, float]:
        parts = gather_objects((rewards.cpu(), {k: v.cpu() for k, v in per_fn.items()}, constant.cpu()))
        return super().reward_metrics(torch.cat([p[0] for p in parts]),
                                      {k: torch.cat([p[1][k] for p in parts]) for k in per_fn},
                                      torch.cat([p[2] for p in parts]))

    def rollout_metrics(self, batch: RolloutBatch, rounds: int) -> dict[str, float]:
        self.step_tokens = float(batch.completion_mask.sum())
        return super().rollout_metrics(RolloutBatch.cat(gather_objects(batch.to("cpu"))), rounds)

    def sample_records(self, batch: RolloutBatch, rewards: torch.Tensor, per_fn: dict[str, torch.Tensor],
                       advantages: torch.Tensor) -> list[dict[str, Any]]:
        parts = gather_objects(super().sample_records(batch, rewards, per_fn, advantages))
        return [r for part in parts for r in part] if self.env.is_main else []

    def _out_of_time(self, start: float) -> bool:
        # Every process must stop after the same step: out of time as soon as any process is.
        if self.time_budget_s is None:
            return False
        return max_float(float(super()._out_of_time(start))) > 0

    def progress_bar(self) -> Progress:
        return Progress(self.config.total_steps, self.step_count, self.config.progress and self.env.is_main)

    # -- evaluation -------------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Each process evaluates its slice of the held-out prompts; the results are weighted by
        prompts (every metric is a mean over prompts or over an equal number of samples each)."""
        if not self.eval_rows:
            return {}
        n, w, r = len(self.eval_rows), self.env.world_size, self.env.rank
        start, stop = r * n // w, (r + 1) * n // w
        result, error = {}, None
        self.policy.eval()
        with self.rollout_phase():
            try:
                if stop > start:
                    with torch.inference_mode():
                        result = evaluate(self.sampler, self.eval_ids[start:stop], self.eval_rows[start:stop],
                                          params=self.eval_params(), k=self.config.eval_samples,
                                          reward_fns=self.reward_fns, reward_weights=self.reward_weights,
                                          is_correct=self.is_correct, seed=self.config.seed + 7_777_777 + start)
            except Exception as e:  # noqa: BLE001 - re-raised below, in every process
                error = e
        raise_if_any_failed(error)
        parts = [(count, res) for count, res in gather_objects((stop - start, result)) if count > 0]
        keys = parts[0][1].keys() if parts else []
        return {k: sum(c * res[k] for c, res in parts if k in res) / sum(c for c, res in parts if k in res)
                for k in keys}

    # -- checkpoints ------------------------------------------------------------------------------
    def save(self) -> Path:
        state = {"position": self.stream.position, "config": as_plain(self.config), **self.extra_state()}
        return dckpt.save_dist_checkpoint(self.out / "checkpoints", self.step_count, env=self.env, policy=self.policy,
                                          optimizer=self.optimizer, scheduler=self.scheduler, state=state,
                                          tokenizer=self.tokenizer, reference=self.reference_to_save(),
                                          keep=self.config.keep_checkpoints)

    def resume(self, spec: str) -> None:
        folder = ckpt.resolve_checkpoint(spec, self.out / "checkpoints")
        state = dckpt.load_dist_checkpoint(folder, env=self.env, policy=self.policy, optimizer=self.optimizer,
                                           scheduler=self.scheduler, reference=self.reference_to_save())
        self.step_count = int(state["step"])
        self.stream.position = int(state["position"])
        self.load_extra_state(state)
        self.metrics_log.truncate_after(self.step_count)
        self.completions_log.truncate_after(self.step_count)
