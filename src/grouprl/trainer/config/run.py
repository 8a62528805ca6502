"""The trainer's keys of the run folder: where it is, what is logged and printed, evaluation, checkpoints,
signals, resume, and torch's thread count (``--help`` sections: run folder, evaluation, precision and
engines). A part of :class:`~grouprl.trainer.config.TrainerConfig`, documented here once."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RunKeys:
    """The run folder, logging, evaluation and checkpoints (part of TrainerConfig)."""

    output_dir: str = "runs/grpo"
    """Run folder: config.yaml, metrics.jsonl, completions.jsonl, checkpoints/, report/."""
    log_completions_every: int = 5
    """Append sample completions to completions.jsonl every this many steps (0 = never)."""
    print_completions: int = 2
    """How many of the logged completions to print to the terminal."""
    eval_every: int = 0
    """Evaluate on the eval set every this many steps (0 = only before and after training)."""
    eval_samples: int = 4
    """k: completions per eval prompt, for accuracy (mean over samples) and pass@k."""
    eval_temperature: float = 1.0
    """Sampling temperature of evaluation (0 = greedy, then k is 1)."""
    save_every: int = 0
    """Checkpoint every this many steps (0 = only at the end)."""
    keep_checkpoints: int = 2
    """Keep only the newest this many checkpoints."""
    save_on_signal: bool = True
    """On SIGTERM (a scheduler's preemption) or Ctrl-C, finish the step and save a checkpoint of it if that ends
    within 25 s (Slurm and Kubernetes kill 30 s after SIGTERM); a second signal stops at once. Off: stop after the
    step without saving. The exit status is 128 + the signal's number."""
    resume_from: str | None = None
    """Resume from a checkpoint folder, or latest (the newest in output_dir/checkpoints)."""
    loggers: tuple[str, ...] = ()
    """Trackers besides metrics.jsonl (always written): tensorboard, trackio, wandb. trackio is Hugging Face's
    local-first tracker; wandb writes into the run folder's wandb/ (WANDB_MODE=offline needs no network). Each is an
    extra (pip install 'grouprl[wandb]'); a missing one is refused before the model loads. docs/logging.md."""
    tensorboard: bool = True
    """Also write TensorBoard event files where the tensorboard package is installed (silently skipped where not;
    loggers: [tensorboard] requires it). false: never."""
    progress: bool = True
    """Show each step on the console: a live bar (reward, KL, throughput) on a terminal, one line per step otherwise
    (a file, a pipe)."""
    num_threads: int = 0
    """torch intra-op threads (0 = leave PyTorch's choice)."""
