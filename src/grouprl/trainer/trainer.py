"""The trainer: one step loop in the paper's order for every language-model algorithm.

One step (DeepSeekMath, section 4): P prompts -> G completions each from pi_old -> rewards -> advantages ->
update -> metrics. ``config.algo`` picks from :data:`~grouprl.trainer.algorithms.ALGORITHMS` the baseline
(group or critic), the update rule and beta's controller.

Departures from the paper: outcome supervision only; on-policy updates (mu = 1, one minibatch) use the ratio
``exp(logp - logp.detach())`` instead of an old-policy forward (same REINFORCE gradient); aggregation,
advantage scale and importance level are knobs after DAPO, Dr. GRPO and GSPO; ``None`` rewards are left out
of the group statistics.

Example::

    from grouprl import TrainerConfig, Trainer
    from grouprl.models import load_policy
    policy, tok = load_policy("smollm2-135m")
    def short(prompts, completions, **_): return [-len(c) / 100 for c in completions]
    Trainer(TrainerConfig(algo="grpo", total_steps=10), policy=policy, tokenizer=tok, reward_fns=[short],
            train_data=[{"prompt": "Say hi."}] * 8).train()"""

from __future__ import annotations

import copy
import json
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from grouprl.algos import kl_per_token
from grouprl.algos.distillation import distill_advantages
from grouprl.algos.rollout_correction import rollout_mismatch
from grouprl.errors import NonFiniteError
from grouprl.models import store_frozen_linears, unwrap_ddp
from grouprl.models.precision import Formats, pinned, resolve_formats
from grouprl.rewards.base import unique_names
from grouprl.run import checkpoint_files as ckpt
from grouprl.run.allocator import describe as describe_allocator
from grouprl.run.files import as_plain
from grouprl.run.health import HealthWatch, replay
from grouprl.run.logs import RECORD_TEXT_CAP, JsonlLog, NullLog, PhaseTimer, Progress
from grouprl.run.loop import run_loop
from grouprl.trainer.advantages import make_baseline
from grouprl.trainer.ahead import collect_ahead
from grouprl.trainer.algorithms import ALGORITHMS, KL_CONTROLLERS
from grouprl.trainer.checks import check
from grouprl.trainer.collect import Collected, combine_metrics
from grouprl.trainer.critic import Critic
from grouprl.trainer.inputs import RunInputs
from grouprl.trainer.loss_variants import rollout_correction
from grouprl.trainer.metrics import reward_metrics, rollout_metrics, row_advantages, sample_records
from grouprl.trainer.one_process import OneProcess
from grouprl.trainer.policy import PolicyPasses, bf16_base_fits, default_reference, prepare_policy
from grouprl.trainer.rollout_plan import plan_rollout
from grouprl.trainer.rules import UPDATE_RULES
from grouprl.trainer.sources import make_source
from grouprl.trainer.teacher import make_teacher
from grouprl.trainer.update import UpdateBatch, weighted
from grouprl.types import RolloutBatch

if TYPE_CHECKING:
    from grouprl.trainer.config import TrainerConfig


class Trainer:
    """Any language-model algorithm of :data:`~grouprl.trainer.algorithms.ALGORITHMS` on a Hugging Face causal LM.

    Args:
        config: a :class:`~grouprl.trainer.config.TrainerConfig` (``algo`` picks the algorithm).
        policy, tokenizer: the model to train (any ``AutoModelForCausalLM``) and its tokenizer.
        reward_fns: callables ``(prompts, completions, *, completion_ids, **columns) -> list[float | None]``.
        train_data / eval_data: rows with a ``prompt`` (text or chat messages); the other columns go to the
            reward functions.
        reward_weights: one weight per reward function (default 1 each).
        is_correct: ``(completion, row) -> bool`` for evaluation accuracy.
        system_prompt: the task's system prompt (``config.system_prompt`` wins when set).
        inputs: all of the data and reward arguments at once, as :func:`grouprl.cli.build.build_inputs` makes them.
        reference: a frozen reference model; by default a copy of the policy (none with LoRA).
        sampler: a :class:`~grouprl.rollout.protocol.RolloutEngine` (default: the plan's).
        run_config: what config.yaml records (default: ``config``).
        processes: the process group (default: one process).
        critic_backbone: for a critic, the model whose decoder carries the value head.
        teacher, teacher_tokenizer: on-policy distillation's teacher (default: ``config.teacher_model``, loaded).
    """

    def __init__(self, config: TrainerConfig, *, policy: torch.nn.Module, tokenizer: Any,
                 reward_fns: Sequence[Callable] = (), train_data: Sequence[dict[str, Any]] = (),
                 eval_data: Sequence[dict[str, Any]] | None = None, reward_weights: Sequence[float] | None = None,
                 is_correct: Callable[[str, dict], bool] | None = None, system_prompt: str | None = None,
                 inputs: RunInputs | None = None, reference: torch.nn.Module | None = None, sampler: Any = None,
                 run_config: Any = None, processes: Any = None, critic_backbone: torch.nn.Module | None = None,
                 teacher: torch.nn.Module | None = None, teacher_tokenizer: Any = None):
        check(config)
        self.config = c = config
        if c.num_threads:
            torch.set_num_threads(c.num_threads)
        if inputs is None:
            inputs = RunInputs(train_rows=list(train_data), reward_fns=list(reward_fns),
                               eval_rows=list(eval_data or []), reward_weights=reward_weights, is_correct=is_correct,
                               system_prompt=system_prompt, distilled=c.distill_coef > 0)
        self.reward_fns, self.reward_weights = inputs.reward_fns, inputs.reward_weights
        self.is_correct = inputs.is_correct
        self.train_rows, self.eval_rows = inputs.train_rows, inputs.eval_rows
        if len(self.train_rows) < c.prompts_per_step:
            warnings.warn(f"the training set has {len(self.train_rows)} row(s) and prompts_per_step is "
                          f"{c.prompts_per_step}: every step trains on copies of the same prompts", stacklevel=2)
        if c.group_by is not None and c.group_by not in self.train_rows[0]:
            raise ValueError(f"group_by={c.group_by!r} is not a column of the training rows; their columns: "
                             f"{', '.join(self.train_rows[0])}")

        algo = ALGORITHMS.get(c.algo)
        self.processes = processes if processes is not None else OneProcess()
        self.is_main = self.processes.is_main
        self.health = HealthWatch(not c.distill_coef)  # entropy collapse, KL spikes, groups with nothing to teach
        policy = prepare_policy(policy, c)
        self.formats = run_formats(c, self.processes)
        self.rollout_plan = plan_rollout(with_values(c, pinned(self.formats)), self.formats, policy,
                                         self.processes.device, multi_turn=inputs.env is not None, sampler=sampler)
        self.config = c = with_values(c, {**pinned(self.formats), "rollout_is": self.rollout_plan.rollout_is})
        reference = reference if reference is not None else default_reference(policy, c)
        self.critic = Critic(c, policy, critic_backbone) if algo.critic else None
        if bf16_base_fits(policy, c, self.processes, self.rollout_plan.own_weights):
            store_frozen_linears(policy, torch.bfloat16)
        policy, reference = self.processes.place(policy, reference)
        self.passes = PolicyPasses(policy, reference, c, self.processes.forward_model, self.processes.world_size > 1)
        self.teacher = make_teacher(c, self.passes, tokenizer, teacher, teacher_tokenizer, self.processes.device)
        self.baseline = self.critic or make_baseline(c, self.processes.sum)
        self.rule = UPDATE_RULES.get(algo.update)(c, self.passes, self.processes, self.critic)
        self.kl = KL_CONTROLLERS.get(c.kl_controller_name)(c)
        self.source = make_source(c, inputs, policy, tokenizer, self.rollout_plan, sampler, self.processes.share)
        self.sampler, self.collector, self.tokenizer = self.source.sampler, self.source.collector, tokenizer
        self.ahead = collect_ahead(self.collector, self.sampler, c, self.processes)
        self.collector = self.ahead or self.collector
        self.step_count, self.time_budget_s = 0, None
        self.out = Path(c.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.run_config = with_values(run_config, pinned(self.formats)) if run_config is not None else c
        self.metrics_log = JsonlLog(self.out / "metrics.jsonl") if self.is_main else NullLog()
        self.completions_log = (JsonlLog(self.out / "completions.jsonl", text_cap=RECORD_TEXT_CAP) if self.is_main
                                else NullLog())
        self.eval_history: list[dict[str, Any]] = []
        self.setup = {**self.rollout_plan.setup(), "allocator": describe_allocator(), **run_setup(self.reward_fns)}

    @property
    def policy(self) -> torch.nn.Module:
        return self.passes.policy

    @property
    def reference(self) -> torch.nn.Module | None:
        return self.passes.reference

    def train(self) -> dict[str, Any]:
        return run_loop(self)

    # -- one step -----------------------------------------------------------------------------------
    def step(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """One iteration, in the paper's order. Returns (metrics, sample completions)."""
        c, timer, t0 = self.config, PhaseTimer(), time.perf_counter()
        got = self.collect(timer)                                                    # o_i ~ pi_old(.|q), r_i
        self.sampler.rest()  # frees the engine's weight copy during the update
        mask = got.batch.completion_mask.clone()
        if c.mask_truncated:
            mask = mask * (~got.batch.truncated).unsqueeze(-1).to(mask.dtype)
        # rows out of the loss need no log-probs; distilled, every row carries the teacher's signal
        live = self.baseline.rows_in_loss(got, mask) if self.teacher is None else mask.sum(-1) > 0
        with timer("logprobs"):
            old_logp = self.passes.old_logprobs(got.batch, live) if c.needs_old_logprobs else None
            ref_logp = self.passes.reference_logprobs(got.batch, live) if c.needs_reference else None
        beta = self.kl.beta
        data, metrics, constant = self.baseline.prepare(got, mask, old_logp, ref_logp, beta, self.step_count)  # A
        if self.teacher is not None:
            with timer("teacher"):
                metrics.update(self.distill(got, data, mask, live))
        records = self.records(got, data)  # the advantages as estimated, before any importance weights
        metrics.update(self.correct_rollout(data))
        with timer("update"):                                                        # mu x minibatches
            metrics = {**self.rule.update(data, self.step_count, 0.0 if c.kl_penalty_in_reward else beta), **metrics}
        self.sampler.update_weights(unwrap_ddp(self.policy))
        if old_logp is not None and ref_logp is not None:  # the KL the rollout policy had from the reference
            sequence_kl = float((kl_per_token(old_logp, ref_logp, c.kl_estimator) * data.mask).sum(-1).mean())
            metrics["policy/kl_sequence"] = sequence_kl
            self.kl.update(sequence_kl, got.batch.batch_size)
        if c.needs_reference:
            metrics["kl/beta"] = beta
        if c.ref_sync_steps and (self.step_count + 1) % c.ref_sync_steps == 0:
            self.passes.sync_reference(c.ref_sync_alpha)
        return self.finish_metrics(got, data, constant, metrics, timer, t0), records

    def collect(self, timer: PhaseTimer) -> Collected:
        """The step's rollout and rewards; a failure in any process stops every process with it."""
        result, error = None, None
        with self.processes.rollout(self.sampler, self.policy, ahead=self.ahead is not None):
            try:
                result = self.collector.collect(self.step_count, timer)
            except Exception as e:  # noqa: BLE001 - re-raised below, in every process
                error = e
        self.processes.check(error)
        device = self.processes.device  # rewards and a vLLM rollout come back on the CPU
        return result if device is None else result.to(device)

    def distill(self, got: Collected, data: UpdateBatch, mask: torch.Tensor, live: torch.Tensor) -> dict[str, float]:
        """Add ``distill_coef`` x (the teacher's - the sampling policy's log-prob) to each token's advantage
        (:func:`~grouprl.algos.distillation.distill_advantages`), every row back in the loss: an all-equal group
        has advantage 0 but still the teacher's signal."""
        teacher_logp = self.teacher.logprobs(got.batch, live).to(mask.device)
        data.mask = mask
        data.advantages, m = distill_advantages(data.advantages, got.batch.sampling_logprobs.to(mask.device),
                                                teacher_logp, mask, self.config.distill_coef)
        return {f"distill/{k}": float(v) for k, v in m.items()}

    def correct_rollout(self, data: UpdateBatch) -> dict[str, float]:
        """With ``rollout_is`` on, weight each token by the capped or masked ratio pi_old / pi_rollout."""
        c = self.config
        if c.rollout_is_in_update:
            data.rollout_logp = data.rollout.sampling_logprobs.to(data.mask.device)
            return {}
        if data.old_logp is None:
            return {}
        rollout_logp = data.rollout.sampling_logprobs.to(data.old_logp.device)
        if c.rollout_is_level == "none":
            return {k: float(v) for k, v in rollout_mismatch(data.old_logp, rollout_logp, data.mask).items()}
        weights, m = rollout_correction(c, data.old_logp, rollout_logp, data.mask)
        data.advantages = weighted(data.advantages, weights)
        return {k: float(v) for k, v in m.items()}

    def finish_metrics(self, got: Collected, data: UpdateBatch, constant: torch.Tensor | None,
                       metrics: dict[str, float], timer: PhaseTimer, t0: float) -> dict[str, float]:
        """The step's metrics over every process's rows."""
        parts = self.processes.gather((data.rewards.cpu(), {k: v.cpu() for k, v in got.per_fn.items()},
                                       None if constant is None else constant.cpu(), got.batch.to("cpu"), got.metrics))
        rewards = torch.cat([p[0] for p in parts])
        per_fn = {k: torch.cat([p[1][k] for p in parts]) for k in got.per_fn}
        constant = None if constant is None else torch.cat([p[2] for p in parts])
        collected = combine_metrics([p[4] for p in parts], absent_is_zero=True)  # each process's equal share
        metrics = {**reward_metrics(rewards, per_fn, constant), **collected, **self.sampler.metrics(),
                   **rollout_metrics(RolloutBatch.cat([p[3] for p in parts]), got.rounds), **metrics,
                   **timer.metrics(), "time/step": time.perf_counter() - t0}
        tokens = float(got.batch.completion_mask.sum())
        metrics["throughput/tokens_per_s"] = tokens / metrics["time/step"]
        metrics["throughput/rollout_tokens_per_s"] = tokens / max(timer.seconds.get("rollout", 0.0), 1e-9)
        # The update's means are over the tokens in the loss, which differ between processes when all-equal
        # groups or truncated completions are left out: weigh each process's by those.
        return self.processes.combine(metrics, float(data.mask.sum()))

    def records(self, got: Collected, data: UpdateBatch) -> list[dict[str, Any]]:
        """Every process's sample records on the main process; empty elsewhere."""
        mine = sample_records(got.batch, data.rewards, got.per_fn, row_advantages(data.advantages, data.mask))
        parts = self.processes.gather(mine)
        return [r for part in parts for r in part] if self.is_main else []

    def close(self) -> None:
        """Stop the rollout thread, then release the engine's process groups and servers."""
        if self.ahead is not None:
            self.ahead.close()
        if self.teacher is not None:
            self.teacher.close()
        self.sampler.close()

    # -- the run loop's hooks -----------------------------------------------------------------------
    def finished(self) -> bool:
        return self.step_count >= self.config.total_steps

    def eval_due(self) -> bool:
        every = self.config.eval_every
        return bool(every) and self.step_count % every == 0

    def progress_bar(self) -> Progress:
        return Progress(self.config.total_steps, self.step_count, self.config.progress and self.is_main,
                        label=self.config.algo)

    def agree(self, flag: bool) -> bool:
        return self.processes.any(flag)

    def evaluate(self) -> dict[str, float]:
        """Held-out metrics (empty without an eval set), each process's share weighted by its prompts."""
        if not self.eval_rows:
            return {}
        first, stop = self.processes.share(len(self.eval_rows))
        result, error = {}, None
        self.policy.eval()
        with self.processes.rollout(self.sampler, self.policy):
            try:
                if stop > first:
                    with torch.inference_mode():
                        result = self.source.evaluate(first, stop)
            except Exception as e:  # noqa: BLE001 - re-raised below, in every process
                error = e
        self.processes.check(error)
        parts = [(n, res) for n, res in self.processes.gather((stop - first, result)) if n > 0]
        if len(parts) == 1:
            return parts[0][1]
        return {k: sum(n * res[k] for n, res in parts if k in res) / sum(n for n, res in parts if k in res)
                for k in parts[0][1]}

    def log_completions(self, records: list[dict[str, Any]], progress: Progress) -> None:
        c = self.config
        if not c.log_completions_every or self.step_count % c.log_completions_every:
            return
        self.completions_log.append([{"step": self.step_count, **r} for r in records])
        for r in records[: c.print_completions]:
            progress.sample(self.step_count, r["reward"], r["completion"])

    # -- checkpoints --------------------------------------------------------------------------------
    def checkpoint_parts(self) -> dict[str, Any]:
        stateful, modules = dict(self.rule.checkpoint_parts()), {}
        if self.critic is not None:
            critic_state, modules = self.critic.checkpoint_parts()
            stateful.update(critic_state)
        return {"policy": self.policy, "reference": self.reference if self.config.ref_sync_steps else None,
                "stateful": stateful, "modules": modules}

    def save(self) -> Path:
        local = (getattr(p, "to_local", lambda p=p: p)() for p in self.policy.parameters())  # a shard under FSDP
        if self.processes.any(not all(bool(torch.isfinite(t).all()) for t in local)):
            raise NonFiniteError("the policy's weights are no longer finite: this state is not saved")
        state = {"position": self.collector.stream.position, "kl_controller": self.kl.state_dict(),
                 "config": as_plain(self.config), "formats": self.formats.as_dict(),
                 "rollout": self.rollout_plan.as_dict()}
        return self.processes.save(self.out / "checkpoints", self.step_count, state=state, tokenizer=self.tokenizer,
                                   keep=self.config.keep_checkpoints, **self.checkpoint_parts())

    def resume(self, spec: str) -> None:
        folder = ckpt.resolve_checkpoint(spec, self.out / "checkpoints")
        state = self.processes.load(folder, **self.checkpoint_parts())
        self.step_count = int(state["step"])
        self.collector.stream.position = int(state["position"])
        if "kl_controller" in state:
            self.kl.load_state_dict(state["kl_controller"])
        self.sampler.update_weights(unwrap_ddp(self.policy))
        self.metrics_log.truncate_after(self.step_count)
        self.completions_log.truncate_after(self.step_count)
        self.health = HealthWatch(not self.config.distill_coef)
        replay(self.metrics_log.records(), self.health)


def run_formats(config: TrainerConfig, processes: Any) -> Formats:
    """The run's number formats, decided by the first process (or a resumed checkpoint) and sent to the others."""
    formats, error = None, None
    if processes.is_main:
        try:
            recorded = None
            if config.resume_from and config.dtype == "auto":
                folder = ckpt.resolve_checkpoint(config.resume_from, Path(config.output_dir) / "checkpoints")
                recorded = Formats.from_dict(json.loads((folder / "state.json").read_text()).get("formats"))
            formats = resolve_formats(config.dtype, config.ref_dtype, config.rollout_dtype, processes.device,
                                      recorded=recorded)
        except Exception as e:  # noqa: BLE001 - re-raised below, in every process
            error = e
    processes.check(error)
    return processes.gather(formats)[0]


def with_values(config: Any, values: dict[str, Any]) -> Any:
    """A shallow copy of ``config`` (a dataclass, or a dict as config.yaml records) with ``values`` set."""
    if isinstance(config, dict):
        return {**config, **values}
    config = copy.copy(config)
    for key, value in values.items():
        setattr(config, key, value)
    return config


def run_setup(reward_fns: Sequence[Callable]) -> dict[str, str]:
    """How each code-running reward isolates programs (its ``isolation`` attribute), by name."""
    return {f"isolation/{name}": fn.isolation for name, fn in zip(unique_names(reward_fns), reward_fns)
            if isinstance(getattr(fn, "isolation", None), str)}


GRPOTrainer = Trainer
