"""What each ``grouprl`` command does once its arguments are parsed; it prints through ``echo``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from grouprl.cli.build import RunInputs, build_inputs, load_model, load_newest_model
from grouprl.cli.phases import announce, data_source
from grouprl.config import TINY_MODEL, RewardModelConfig, TrainConfig
from grouprl.errors import ConfigError
from grouprl.run.folder import claimed

Echo = Callable[[str], None]


def before_after(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str | None:
    """``accuracy before=0.188 after=0.406`` (else success or mean reward), keys with or without ``eval/``."""
    def get(d: dict[str, Any] | None, key: str) -> float | None:
        if not d:
            return None
        value = d.get(f"eval/{key}", d.get(key))
        return float(value) if isinstance(value, int | float) else None

    for key, label in (("accuracy", "accuracy"), ("success", "success"), ("mean_reward", "mean reward")):
        b, a = get(before, key), get(after, key)
        if b is not None and a is not None:
            return f"{label} before={b:.3f} after={a:.3f}"
    return None


def train(config: TrainConfig, echo: Echo = print, overwrite: bool = False,
          phase: Echo = announce) -> tuple[dict[str, Any], Path]:
    """Claim the run folder, build, train, write the report: (summary, report path); ``phase`` announces phases."""
    from grouprl.trainer.dist.group import torchrun_rank

    first = torchrun_rank() == 0
    with claimed(config, overwrite=overwrite, echo=echo, claim=first) as config:
        return _train_claimed(config, echo, phase if first else lambda text: None)


def _train_claimed(config: TrainConfig, echo: Echo, phase: Echo) -> tuple[dict[str, Any], Path]:
    phase(f"loading the prompts and reward functions ({data_source(config)})")
    inputs = build_inputs(config)  # data, reward functions, checker: every cheap check before the model loads
    from grouprl.cli.build import build_trainer
    from grouprl.cli.launch import join_run, leave_run
    from grouprl.report import write_report

    env = join_run(config)  # under torchrun with several processes: this process's place in the run
    trainer = None
    try:
        phase(f"loading the model {config.model}")
        policy, tokenizer = load_model(config.model, config.seed)
        phase("building the trainer (reference, rollout engine, number formats)")
        trainer = build_trainer(config, inputs, policy, tokenizer, env)
        if trainer.is_main:  # what was chosen or found at start (also in summary.json and the report)
            for key, value in trainer.setup.items():
                echo(f"{key}: {value}")
        evaluation = "a held-out evaluation first, then " if inputs.eval_rows and not config.resume_from else ""
        phase(f"training: {evaluation}{config.total_steps} step{'' if config.total_steps == 1 else 's'}")
        summary = trainer.train()
    finally:
        if trainer is not None:
            trainer.close()
        leave_run(env)
    if env is not None and not env.is_main:  # the first process writes the report and prints the summary
        return summary, Path(config.output_dir) / "report"
    report = write_report(config.output_dir)
    echo(f"run folder: {config.output_dir} (config.yaml, metrics.jsonl, completions.jsonl, checkpoints/)")
    echo(f"trained model: {Path(summary['checkpoint']) / 'model'}")
    echo(f"report: {report}")
    line = before_after(summary.get("eval_before"), summary.get("eval_after"))
    echo(line or "no held-out evaluation (eval_size is 0, or nothing to measure)")
    return summary, report


def evaluate_model(config: TrainConfig, inputs: RunInputs, policy: Any, tokenizer: Any) -> dict[str, float]:
    """Held-out metrics of ``policy`` on ``inputs.eval_rows``, sampled as the trainer's evaluation samples them."""
    import torch

    from grouprl.models.precision import pinned, resolve_formats
    from grouprl.trainer.rollout_plan import plan_rollout
    from grouprl.trainer.sources import make_source
    from grouprl.trainer.trainer import with_values

    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    # a run's config.yaml pins the formats it trained in; auto decides them as a run on this machine would
    formats = resolve_formats(config.dtype, config.ref_dtype, config.rollout_dtype)
    config = with_values(config, pinned(formats))
    # one pass over the held-out prompts: compiling the decode steps would not pay for itself
    plan = plan_rollout(config, formats, policy, None, multi_turn=inputs.env is not None, steps=1)
    source = make_source(config, inputs, policy, tokenizer, plan, None, lambda n: (0, n))
    policy.eval()
    with torch.inference_mode():
        return source.evaluate(0, len(inputs.eval_rows))


def format_table(rows: list[tuple[str, str]]) -> str:
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)


def evaluate_command(config: TrainConfig, echo: Echo = print) -> dict[str, float]:
    """``grouprl eval``: evaluate ``config.model`` on the held-out prompts of ``config`` and print a table."""
    if config.eval_size == 0:
        raise ConfigError("eval_size is 0: there is nothing to evaluate; set eval_size (or eval_dataset)")
    inputs = build_inputs(config)
    if not inputs.eval_rows:
        raise ConfigError("no held-out prompts: set eval_size, eval_fraction, eval_dataset or eval_split")
    from grouprl.run.signals import interrupts

    with interrupts():  # SIGTERM like Ctrl-C; an environment's own KeyboardInterrupt is not taken for either
        policy, tokenizer = load_newest_model(config.model, config.seed, echo)
        result = evaluate_model(config, inputs, policy, tokenizer)
    k = 1 if config.eval_temperature == 0 else config.eval_samples
    source = config.env or config.task or config.eval_dataset or config.dataset
    source += f" ({config.eval_split})" if config.eval_split and not (config.env or config.task) else ""
    rows = [("model", config.model), ("prompts", f"{len(inputs.eval_rows)} held-out from {source}"),
            ("samples", f"{k} per prompt at temperature {config.eval_temperature}")]
    labels = {"eval/accuracy": "accuracy", "eval/success": "success", f"eval/pass@{k}": f"pass@{k}",
              "eval/mean_reward": "mean reward", "eval/turns_mean": "turns", "eval/len_mean": "mean length (tokens)"}
    rows += [(label, f"{result[key]:.3f}") for key, label in labels.items() if key in result]
    echo(format_table(rows))
    return result


def report_command(run_dir: str, echo: Echo = print) -> Path:
    """``grouprl report RUN_DIR``: (re)write the run's plots and HTML page."""
    from grouprl.report import summarize, write_report

    path = write_report(run_dir)
    summary = summarize(run_dir)
    echo(f"report: {path}")
    line = before_after(summary.get("eval_before"), summary.get("eval_after"))
    if line:
        echo(line)
    return path


def reward_model_start(spec: str, seed: int) -> tuple[Any, Any]:
    """(model or folder, tokenizer or None) that ``train_reward_model`` starts from."""
    if spec == TINY_MODEL:
        import torch
        from transformers import LlamaForSequenceClassification

        from grouprl.models import tiny_llama_config, tiny_tokenizer

        tokenizer = tiny_tokenizer()
        with torch.random.fork_rng(devices=[]):  # seeded without touching the caller's generator
            torch.manual_seed(seed)
            model = LlamaForSequenceClassification(tiny_llama_config(tokenizer, num_labels=1))
        return model, tokenizer
    from grouprl.models.bundled import BUNDLED, bundled_model_folder

    if spec in BUNDLED:
        return str(bundled_model_folder(spec)), None
    if not Path(spec).expanduser().exists():
        raise FileNotFoundError(f"model {spec!r} is neither a bundled model ({', '.join(BUNDLED.names())}), "
                                f"{TINY_MODEL!r}, nor an existing folder")
    return spec, None


def train_rm_command(config: RewardModelConfig, echo: Echo = print) -> Any:
    """``grouprl train-rm``: fit a Bradley-Terry reward model to preference pairs and save it."""
    from grouprl.rewards.reward_model import check_replaceable, load_pairs, train_reward_model

    check_replaceable(config.output_dir)  # a run's or a user's folder is refused before any work
    load_pairs(config.pairs)  # a missing file or column fails here, before the model loads
    if config.eval_pairs:
        load_pairs(config.eval_pairs)
    model, tokenizer = reward_model_start(config.model, config.seed)
    result = train_reward_model(
        model, tokenizer, config.pairs, output_dir=config.output_dir, eval_pairs=config.eval_pairs,
        eval_fraction=config.eval_fraction, epochs=config.epochs, batch_size=config.batch_size, lr=config.lr,
        weight_decay=config.weight_decay, seed=config.seed, system_prompt=config.system_prompt,
        max_length=config.max_length)
    echo(f"reward model: {result.output_dir}")
    echo(f"train loss {result.train_loss:.4f}" + (
        "" if result.eval_accuracy is None else
        f"; held-out pairs ranked right {result.eval_accuracy:.3f} (loss {result.eval_loss:.4f})"))
    echo(f"use it: grouprl train --reward_model {result.output_dir} ...")
    return result
