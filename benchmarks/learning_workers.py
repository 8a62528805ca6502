"""The two worker processes of ``benchmarks/learning.py``: each trains one framework (grouprl or TRL's
``GRPOTrainer``) at the demo's settings, takes a step or saves its policy when the parent says so, and answers in
JSON lines on its private copy of stdout (whatever the libraries print goes to stderr)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from learning_settings import demo_config, trl_config

# -- the protocol -----------------------------------------------------------------------------------------
PROTOCOL = None  # the worker's private copy of its stdout, for its JSON lines only


def start_protocol() -> None:
    """Keep stdout for the JSON lines; send whatever the libraries print to stderr instead."""
    global PROTOCOL
    PROTOCOL = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)


def emit(record: dict) -> None:
    PROTOCOL.write(json.dumps(record) + "\n")
    PROTOCOL.flush()


def save_model(model, folder: str, base: str) -> None:
    """``model`` as a model folder, with the base model's tokenizer (untouched by either trainer)."""
    from transformers import AutoTokenizer

    from grouprl.run.checkpoint_files import save_policy

    save_policy(model, Path(folder), AutoTokenizer.from_pretrained(base))


def serve(model_fn, base: str) -> None:
    """Answer the parent's orders until 'step' (returns: the caller takes the step and emits its record):
    'save FOLDER' saves ``model_fn()``, 'quit' reports the peak RSS and exits."""
    from grouprl.run.logs import peak_rss_mb

    while True:
        order = sys.stdin.readline().strip() or "quit"
        if order == "step":
            return
        if order.startswith("save "):
            save_model(model_fn(), order[5:], base)
            emit({"saved": order[5:]})
            continue
        emit({"peak_rss_mb": peak_rss_mb()})
        os._exit(0)  # TRL's loop is never left otherwise


def grouprl_worker(args: argparse.Namespace) -> None:
    from grouprl.cli.build import build_inputs, build_trainer, load_model
    from grouprl.models import unwrap_ddp
    from grouprl.rollout.scratch import ScratchFolder

    out = ScratchFolder("learning-grouprl-")  # the run's folder goes with the worker, which ends in os._exit
    config = demo_config(args.seed, args.threads, str(out.path), **task(args), **args.set)
    inputs = build_inputs(config)
    policy, tokenizer = load_model(config.model, config.seed)
    trainer = build_trainer(config, inputs, policy, tokenizer)
    emit({"ready": True, "setup": {k: str(v) for k, v in trainer.setup.items()}})

    def step() -> dict:
        start = time.perf_counter()
        metrics, _ = trainer.step()
        seconds = time.perf_counter() - start
        trainer.step_count += 1  # what the run loop does after each step
        return {"seconds": seconds, "reward": metrics["reward/mean"], "len_mean": metrics["rollout/len_mean"]}

    while True:
        serve(lambda: unwrap_ddp(trainer.policy), args.base)
        emit(step())


def trl_worker(args: argparse.Namespace) -> None:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from grouprl.cli.build import build_inputs, load_model
    from grouprl.rewards import score_rewards
    from grouprl.rollout.scratch import ScratchFolder

    scratch = ScratchFolder("learning-trl-")  # TRL's output folder goes with the worker, which ends in os._exit
    out = str(scratch.path)
    c = demo_config(args.seed, args.threads, out, **task(args), **args.set)  # trl_config refuses what TRL lacks
    torch.set_num_threads(args.threads)
    inputs = build_inputs(c)  # the rows, reward functions and weights grouprl trains with
    model, tokenizer = load_model(c.model, c.seed)  # the same weights and tokenizer grouprl starts from
    rows = inputs.train_rows
    system = c.system_prompt if c.system_prompt is not None else inputs.system_prompt

    def messages(prompt):
        if isinstance(prompt, list):
            return prompt
        return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]

    columns = [k for k in rows[0] if k != "prompt"]
    data = Dataset.from_dict({"prompt": [messages(r["prompt"]) for r in rows],
                              **{k: [r[k] for r in rows] for k in columns}})

    def reward(prompts, completions, completion_ids, **kw):  # grouprl's weighted reward, called as grouprl calls it
        texts = [x[-1]["content"] if isinstance(x, list) else x for x in completions]
        scores = score_rewards(inputs.reward_fns, inputs.reward_weights, prompts, texts, completion_ids,
                               {k: kw[k] for k in columns})
        return [None if x != x else x for x in scores.total.tolist()]

    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=trl_config(c, args.seed, out, args.trl_ckpt),
                          train_dataset=data, processing_class=tokenizer)

    class Lockstep(TrainerCallback):
        start = 0.0

        def on_step_begin(self, *a, **kw):
            serve(lambda: trainer.accelerator.unwrap_model(trainer.model), args.base)  # until 'step'
            self.start = time.perf_counter()

        def on_step_end(self, *a, **kw):
            seconds = time.perf_counter() - self.start
            logged = trainer._metrics["train"]
            emit({"seconds": seconds, "reward": logged["reward"][-1],
                  "len_mean": logged["completions/mean_length"][-1]})

    trainer.add_callback(Lockstep())
    emit({"ready": True, "setup": {"dtype": "fp32", "gradient_checkpointing": str(args.trl_ckpt)}})
    trainer.train()


def task(args: argparse.Namespace) -> dict:
    """The arithmetic task's options both frameworks train on and every model is scored on (empty: the demo's)."""
    return {"task_options": args.task_options} if args.task_options else {}
