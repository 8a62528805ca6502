"""Classic-control trainer in the same run loop as the language-model trainers. The budget is counted in
environment steps, since GRPO's iterations (P x G whole episodes) and PPO's (N x T steps) differ in size."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import torch
from torch.distributions import kl_divergence

from grouprl.control import (
    ALGORITHMS,
    Agent,
    ControlConfig,
    EnvBatch,
    ValueNet,
    eval_seeds,
    evaluate_policy,
    make_policy,
)
from grouprl.control.rollout import Trajectories
from grouprl.run import checkpoint_files as ckpt
from grouprl.run.files import as_plain, write_text_atomic
from grouprl.run.logs import JsonlLog, PhaseTimer, Progress
from grouprl.run.loop import run_loop
from grouprl.run.optim import build_optimizer
from grouprl.run.seed_streams import EVAL_STREAM, generator, mix_seed


class _EnvStepProgress(Progress):
    """The progress bar counts environment steps, the unit of the budget."""

    def update(self, step: int, metrics: dict[str, Any], alert: str | None = None) -> None:
        super().update(int(metrics.get("rollout/env_steps", step)), metrics, alert)


class ControlTrainer:
    name = "rl"

    def __init__(self, config: ControlConfig, run_config: Any = None):
        self.config = c = config
        if c.num_threads:
            torch.set_num_threads(c.num_threads)
        algo_cls = ALGORITHMS.get(c.algo)
        torch.manual_seed(c.seed)  # network initialisation
        self.envs = EnvBatch(c.env, algo_cls.num_envs(c.section))
        self.eval_envs = EnvBatch(c.env, c.eval_episodes)
        policy = make_policy(self.envs.obs_dim, self.envs.action_space, c.hidden_sizes, c.activation)
        critic = ValueNet(self.envs.obs_dim, c.hidden_sizes, c.activation) if algo_cls.needs_critic else None
        self.agent = Agent(policy, critic)
        self.reference = copy.deepcopy(policy).requires_grad_(False)  # pi_0, for the policy/kl metric
        self.algorithm = algo_cls(c.section, self.agent, self.envs, gamma=c.gamma, reward_scale=c.reward_scale,
                                  seed=c.seed)
        self.optimizer, self.scheduler = build_optimizer(self.algorithm.trainable(), c.section.lr, (0.9, 0.999), 0.0,
                                                         0, 1, "constant")
        self.time_budget_s: float | None = None
        self.is_main = True
        self.health = None  # a solved control policy is meant to stop exploring: the LM rules do not apply
        self.out = Path(c.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.run_config = run_config if run_config is not None else c
        self.metrics_log = JsonlLog(self.out / "metrics.jsonl")
        self.eval_history: list[dict[str, Any]] = []
        self.setup: dict[str, Any] = {}
        self.step_count = 0
        self.env_steps = 0
        self.next_eval = 0
        self.solved_at: int | None = None
        self._last_eval: tuple[int, dict[str, float]] | None = None

    # -- the loop's hooks -------------------------------------------------------------------------
    def finished(self) -> bool:
        return self.env_steps >= self.config.total_env_steps or self.solved_at is not None

    def eval_due(self) -> bool:
        return bool(self.config.eval_every_env_steps) and self.env_steps >= self.next_eval

    def progress_bar(self) -> Progress:
        c = self.config
        return _EnvStepProgress(c.total_env_steps, self.env_steps, c.progress, label=f"{c.algo} {c.env}",
                                rate=("throughput/env_steps_per_s", "steps/s"))

    def agree(self, flag: bool) -> bool:
        return flag  # one process

    def log_completions(self, records: list[dict[str, Any]], progress: Progress) -> None:
        pass  # episodes have no text to show

    def step(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        timer, t0 = PhaseTimer(), time.perf_counter()
        # Seeded per iteration, so a resumed run draws what the uninterrupted one would have.
        draws = generator(self.config.seed, self.step_count)
        with timer("rollout"):
            batch = self.algorithm.collect(draws)
        with timer("update"):
            metrics = self.algorithm.update(batch, self.optimizer, draws)
        self.env_steps += batch.env_steps
        metrics.update(self.rollout_metrics(batch))
        metrics["policy/kl"] = self.kl_to_initial(batch)
        metrics.update(timer.metrics())
        metrics["time/step"] = time.perf_counter() - t0
        metrics["throughput/env_steps_per_s"] = batch.env_steps / metrics["time/step"]
        return metrics, []

    def rollout_metrics(self, batch: Trajectories) -> dict[str, float]:
        out = {"rollout/env_steps": float(self.env_steps), "rollout/batch_steps": float(batch.env_steps),
               "rollout/episodes": float(len(batch.episode_returns))}
        if batch.episode_returns:  # a window of a few hundred steps may finish no episode
            returns = torch.tensor(batch.episode_returns, dtype=torch.float64)
            out.update({"reward/mean": float(returns.mean()), "reward/std": float(returns.std(unbiased=False)),
                        "reward/max": float(returns.max()),
                        "rollout/len_mean": float(sum(batch.episode_lengths) / len(batch.episode_lengths))})
        return out

    def kl_to_initial(self, batch: Trajectories) -> float:
        """Mean analytic KL(pi || pi_0) over the batch's states."""
        obs = batch.flat(batch.obs)
        with torch.no_grad():
            return float(kl_divergence(self.agent.policy.distribution(obs), self.reference.distribution(obs)).mean())

    def evaluate(self) -> dict[str, float]:
        c = self.config
        if self._last_eval is not None and self._last_eval[0] == self.env_steps:
            return self._last_eval[1]  # the final evaluation right after a mid-run one at the same point
        every = c.eval_every_env_steps
        self.next_eval = (self.env_steps // every + 1) * every if every else 0
        result = evaluate_policy(self.eval_envs, self.agent.policy, eval_seeds(c.seed, c.eval_episodes),
                                 c.eval_deterministic, sample_seed=mix_seed(c.seed, EVAL_STREAM))
        result["eval/env_steps"] = float(self.env_steps)
        if c.stop_at_return is not None and self.solved_at is None and result["eval/mean_reward"] >= c.stop_at_return:
            self.solved_at = self.env_steps
        self._last_eval = (self.env_steps, result)
        return result

    # -- checkpoints ------------------------------------------------------------------------------
    def save(self) -> Path:
        state = {"env_steps": self.env_steps, "solved_at": self.solved_at, "config": as_plain(self.config)}
        return ckpt.save_checkpoint(self.out / "checkpoints", self.step_count, policy=self.agent, state=state,
                                    reference=self.reference, keep=self.config.keep_checkpoints,
                                    stateful={"optimizer": self.optimizer, "scheduler": self.scheduler})

    def resume(self, spec: str) -> None:
        """Weights, optimizer, budget position and the pi_0 of the KL metric; episodes restart fresh."""
        folder = ckpt.resolve_checkpoint(spec, self.out / "checkpoints")
        state = ckpt.load_checkpoint(folder, policy=self.agent, reference=self.reference,
                                     stateful={"optimizer": self.optimizer, "scheduler": self.scheduler})
        self.step_count, self.env_steps = int(state["step"]), int(state["env_steps"])
        self.solved_at = state["solved_at"]
        every = self.config.eval_every_env_steps
        self.next_eval = (self.env_steps // every + 1) * every if every else 0
        self.metrics_log.truncate_after(self.step_count)

    def train(self) -> dict[str, Any]:
        summary = run_loop(self)
        summary.update(env_steps=self.env_steps, solved_at_env_steps=self.solved_at, env=self.config.env,
                       algo=self.config.algo)
        write_text_atomic(self.out / "summary.json", json.dumps(summary, indent=2))
        return summary
