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
    """On SIGTERM (how a scheduler preempts a job) or Ctrl-C, finish the step in progress and save a
    checkpoint of it before exiting, if the step and the save end within 25 s of the signal (Slurm and
    Kubernetes send SIGKILL 30 s after SIGTERM by default); a second signal, or the 25 s running out,
    stops at once, keeping the checkpoints already written. Off: stop after the step without saving.
    Either way the exit says "interrupted" with status 128 + the signal's number (143 for SIGTERM)."""
    resume_from: str | None = None
    """Resume from a checkpoint folder, or 'latest' (the newest in output_dir/checkpoints)."""
    loggers: tuple[str, ...] = ()
    """Where metrics go besides the run folder's metrics.jsonl (always written): tensorboard (event
    files in the run folder's tensorboard/), trackio (Hugging Face's local-first tracker, into its local
    store; trackio show), wandb (Weights & Biases, into the run folder's wandb/; WANDB_MODE=offline
    needs no network). E.g. --loggers trackio,wandb. Each is an extra, pip install 'grouprl[wandb]';
    an unknown name or a missing package is refused before the model loads. See docs/logging.md."""
    tensorboard: bool = True
    """Also write TensorBoard event files when the tensorboard package is installed (skipped without
    a word when it is not; loggers: [tensorboard] refuses to start without it). false: never."""
    progress: bool = True
    """Show each step on the console: a live bar with reward, KL and tokens/s on a terminal, one plain
    line per step (with seconds per step) when the output is not a terminal (a file, a pipe)."""
    num_threads: int = 0
    """torch intra-op threads (0 = leave PyTorch's choice)."""
