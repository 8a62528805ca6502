"""The trainer's keys of evaluation and of the run folder: logs, checkpoints, signals, resume."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EvaluationKeys:
    SECTION = "evaluation"

    eval_every: int = 0
    """Evaluate on the eval set every this many steps (0 = only before and after training)."""
    eval_samples: int = 4
    """k: completions per eval prompt, for accuracy (mean over samples) and pass@k."""
    eval_temperature: float = 1.0
    """Sampling temperature of evaluation (0 = greedy, then k is 1)."""


@dataclass
class RunFolderKeys:
    SECTION = "run folder (logs, checkpoints)"

    output_dir: str = "runs/grpo"
    """Run folder: config.yaml, metrics.jsonl, completions.jsonl, checkpoints/, report/."""
    resume_from: str | None = None
    """Resume from a checkpoint folder, or latest (the newest in output_dir/checkpoints)."""
    save_every: int = 0
    """Checkpoint every this many steps (0 = only at the end)."""
    keep_checkpoints: int = 2
    """Keep only the newest this many checkpoints."""
    save_on_signal: bool = True
    """On SIGTERM or Ctrl-C, finish the step and checkpoint it if that ends within 25 s (Slurm and Kubernetes kill 30 s
    after SIGTERM); a second signal stops at once. Off: stop without saving. Exit status: 128 + the signal's number."""
    seed: int = 0
    """Seed of every random choice (prompt order, sampling, minibatch shuffles)."""
    log_completions_every: int = 5
    """Append sample completions to completions.jsonl every this many steps (0 = never)."""
    print_completions: int = 2
    """How many of the logged completions to print to the terminal."""
    progress: bool = True
    """Show each step on the console: a live bar (reward, KL, throughput) on a terminal, one line per step otherwise
    (a file, a pipe)."""
    loggers: tuple[str, ...] = ()
    """Trackers besides metrics.jsonl (always written): tensorboard, trackio, wandb. Each is an extra (pip install
    'grouprl[wandb]'), refused before the model loads if missing; WANDB_MODE=offline needs no network."""
