"""Does grouprl learn at least as well as TRL per step, and per second? Held-out accuracy of both along training.

grouprl and TRL's ``GRPOTrainer`` both train the bundled SmolLM2-135M-Instruct on the built-in arithmetic task
with the task's own reward, at the settings of ``grouprl demo`` (src/grouprl/cli/demo.py): 4 prompts x G=8
completions per step, at most 12 new tokens, temperature 1, lr 2e-5 (constant, AdamW betas 0.9/0.99), beta 0.04
(k3), mu = 1, the paper's per-sequence loss aggregation, clipping 0.2, gradient norm 1.0, no gradient
checkpointing, fp32, one torch thread each. grouprl is built from the demo's own config (only the seed, the
threads, the number format and where its run folder goes are set here); TRL gets the same values, translated
by :func:`trl_config`, and the same training rows, reward functions and starting weights. Two differences are
TRL's own and cannot be set there: it scales advantages by the sample std (ddof 1) plus 1e-4, grouprl by the
population std (the paper's), so TRL's advantages are ~0.94x grouprl's at G=8; and TRL keeps all-equal groups in the
loss (their KL term and their share of the denominators), where grouprl drops them by default (``zero_std_groups``;
``--set zero_std_groups='"keep"'`` gives TRL's, and the baseline in benchmarks/results/learning was measured so,
before that default changed).

As in ``benchmarks/vs_trl.py``, each framework runs in its own worker process and the two take their steps in
turn (the order swapped every step), so load from elsewhere falls on both alike. Every ``--save_every`` steps
(and after the last) each worker saves its policy as a model folder (config, safetensors, tokenizer); step 0 is
the base model, saved once and shared. Afterwards every saved model is scored with grouprl's evaluator (what
``grouprl eval --model FOLDER --task arithmetic --eval_size 32 --samples 8 --eval_temperature 1
--max_new_tokens 12 --seed 0`` runs) on the same held-out problems, sampled with the same seeds for every
model. Seconds are cumulative training time: the steps only, not the saves or evaluations.

    .venv-bench/bin/python benchmarks/learning.py --steps 12 --save_every 4 --seeds 0,1,2
    .venv-bench/bin/python benchmarks/learning.py --report_only        # md, png and last line again
    .venv-bench/bin/python benchmarks/learning.py --task_options '{"operands": 3}' --out /tmp/learning-3-operands
                                                                       # another level of the task, for both

An ablation changes one grouprl setting and trains grouprl alone, reading TRL's curves from the baseline's
results (same steps, seeds and evaluation):

    python benchmarks/learning.py --set adam_beta2=0.999 --frameworks grouprl \
        --out benchmarks/results/learning-ablations/adam_beta2-0.999 --compare_with benchmarks/results/learning
    python benchmarks/learning.py --ablations benchmarks/results/learning-ablations \
        --compare_with benchmarks/results/learning                        # one table of every ablation

When TRL trains in the same run, ``--set`` changes both frameworks' settings (TRL's through :func:`trl_config`,
which refuses a setting it has no counterpart for), e.g. a learning rate at which the task does not saturate
within the run, so that the time-gain ratio measures a gain still in progress:

    python benchmarks/learning.py --steps 24 --save_every 4 --seeds 0,1,2 --set lr=3e-6 \
        --out benchmarks/results/learning-lr3e-6

Writes ``results.jsonl`` (one record per framework, seed and saved step), ``learning.md`` and ``learning.png``
into ``--out``. A (framework, seed) already in results.jsonl is skipped, so a killed run continues where it
stopped (with the same settings; other settings need another ``--out``).

The last line is ``step_ratio=<X> time_gain_ratio=<Y>``:

- step_ratio: the mean over seeds of (grouprl's accuracy at the last step / TRL's accuracy at the last step);
- time_gain_ratio: the mean over seeds of (grouprl's gain in accuracy over the base model at its last step) /
  (TRL's gain over the base model at the same cumulative training seconds, interpolated linearly between TRL's
  saved steps, with gain 0 at 0 s, and held at its last value past its last step). Where TRL's gain there is
  <= 0 the seed's ratio, and so the mean, is inf (printed with the reason).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from learning_report import FRAMEWORKS, ablations, read_records, report
from learning_settings import demo_config
from learning_workers import grouprl_worker, start_protocol, task, trl_worker
from machine import cpu_line  # benchmarks/machine.py: every figure says which CPU it came from
from smoke import add_smoke

EVAL_SEED = 0  # the held-out problems and their sampling seeds, the same for every model
PEAKS = {"training": 0.0}  # MiB: the workers of one seed together, the largest over seeds
EVALUATIONS: list[float] = []  # MiB: each evaluation's own peak, in order


def say_peak() -> None:
    """The benchmark's peak memory: this process and, at most, either one seed's workers or one evaluation."""
    from grouprl.run.logs import peak_rss_mb

    own, evaluation = peak_rss_mb(), max(EVALUATIONS, default=0.0)
    print(f"peak RSS {own + max(PEAKS['training'], evaluation):.0f} MiB at most at once: this process {own:.0f}, one "
          f"seed's training workers {PEAKS['training']:.0f}, the largest evaluation {evaluation:.0f} (first "
          f"{EVALUATIONS[0] if EVALUATIONS else 0:.0f}, last {EVALUATIONS[-1] if EVALUATIONS else 0:.0f} of "
          f"{len(EVALUATIONS)})", flush=True)


class Worker:
    def __init__(self, name: str, seed: int, args: argparse.Namespace, base: str):
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false",
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
        self.name = name
        self.proc = subprocess.Popen(
            [args.python, __file__, "--worker", name, "--seed", str(seed), "--threads", str(args.threads),
             "--base", base, "--trl_gradient_checkpointing", str(args.trl_gradient_checkpointing),
             "--task_options", json.dumps(args.task_options),
             *[f"--set={k}={json.dumps(v)}" for k, v in args.set.items()]],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.setup = self.read()["setup"]

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} worker exited (status {self.proc.wait()}); see its output above")
        return json.loads(line)

    def order(self, line: str) -> dict:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> float:
        peak = self.order("quit")["peak_rss_mb"]
        self.proc.wait()
        return peak


# -- training and evaluation ---------------------------------------------------------------------------------
def save_base(folder: Path, model_name: str, python: str) -> str:
    """The base model as a model folder, once (step 0 of every framework and seed), written by a process of its
    own: this one would otherwise hold the model's memory to the end."""
    if not (folder / "model.safetensors").is_file():
        subprocess.run([python, __file__, "--save_base", str(folder), model_name], check=True)
    return str(folder)


def write_base(folder: Path, model_name: str) -> None:
    from grouprl.cli.build import load_model
    from grouprl.run.checkpoint_files import save_policy

    model, tokenizer = load_model(model_name, 0)
    tmp = folder.with_name(folder.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    save_policy(model, tmp, tokenizer)
    tmp.rename(folder)


def train_seed(args: argparse.Namespace, seed: int, names: list[str], base: str) -> dict[str, list[dict]]:
    """Train ``names`` in turn for ``args.steps`` steps; per framework, [{step, seconds, reward, folder}]."""
    workers = [Worker(name, seed, args, base) for name in names]
    for w in workers:
        print(f"seed {seed}: {w.name} worker ready ({', '.join(f'{k}: {v}' for k, v in w.setup.items())})", flush=True)
    saved = {w.name: [{"step": 0, "train_seconds": 0.0, "train_reward": None, "folder": base}] for w in workers}
    total = {w.name: 0.0 for w in workers}
    for i in range(1, args.steps + 1):
        for w in workers if i % 2 == 1 else workers[::-1]:
            r = w.order("step")
            total[w.name] += r["seconds"]
            print(f"  seed {seed} step {i:3d} {w.name:7s} {r['seconds']:6.1f} s (total {total[w.name]:7.1f}) "
                  f"reward {r['reward']:.3f} len {r['len_mean']:.1f}", flush=True)
            if i % args.save_every == 0 or i == args.steps:
                folder = Path(args.models_dir) / f"seed{seed}" / w.name / f"step{i}"
                shutil.rmtree(folder, ignore_errors=True)
                w.order(f"save {folder}")
                saved[w.name].append({"step": i, "train_seconds": total[w.name], "train_reward": r["reward"],
                                      "folder": str(folder)})
    peaks = {w.name: w.close() for w in workers}
    PEAKS["training"] = max(PEAKS["training"], sum(peaks.values()))
    print(f"seed {seed}: peak RSS " + ", ".join(f"{n} {mb:.0f} MiB" for n, mb in peaks.items()), flush=True)
    return saved


def evaluate_one(args: argparse.Namespace, folder: str) -> dict:
    """Held-out metrics of the model in ``folder``: grouprl's evaluator (``grouprl eval``) at the demo's settings."""
    import torch

    from grouprl.cli.build import build_inputs, load_model
    from grouprl.cli.commands import evaluate_model
    from grouprl.rollout.scratch import ScratchFolder
    from grouprl.run.logs import peak_rss_mb

    torch.set_num_threads(args.eval_threads)
    out = ScratchFolder("learning-eval-")
    config = demo_config(EVAL_SEED, args.eval_threads, str(out.path), **task(args),
                         eval_size=args.eval_problems, eval_samples=args.eval_samples, eval_temperature=1.0)
    policy, tokenizer = load_model(folder, EVAL_SEED)
    result = evaluate_model(config, build_inputs(config), policy, tokenizer)
    return {**{k.removeprefix("eval/"): v for k, v in result.items()}, "peak_rss_mb": peak_rss_mb()}


def evaluator(args: argparse.Namespace):
    """``folder -> held-out metrics``, each model scored in a process of its own: an in-process vLLM engine keeps
    its memory after it is dropped, so one process scoring model after model grows by gigabytes each."""
    cache: dict[str, dict] = {}
    forwarded = [a for a in sys.argv[1:] if a != "--report_only"]

    def evaluate(folder: str) -> dict:
        if folder not in cache:
            start = time.perf_counter()
            got = subprocess.run([args.python, __file__, *forwarded, "--evaluate", folder], stdout=subprocess.PIPE,
                                 text=True, check=True)
            cache[folder] = json.loads(got.stdout.splitlines()[-1])
            EVALUATIONS.append(cache[folder].pop("peak_rss_mb"))
            print(f"  eval {folder}: accuracy {cache[folder]['accuracy']:.3f} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
        return cache[folder]

    return evaluate


def settings(args: argparse.Namespace) -> dict:
    return {"steps": args.steps, "save_every": args.save_every, "eval_problems": args.eval_problems,
            "eval_samples": args.eval_samples, "threads": args.threads,
            "trl_gradient_checkpointing": args.trl_gradient_checkpointing, "grouprl_overrides": args.set,
            **task(args)}


def run(args: argparse.Namespace, command: str) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.jsonl"
    records = read_records(path)
    mine = settings(args)
    other = {json.dumps(r["settings"], sort_keys=True) for r in records} - {json.dumps(mine, sort_keys=True)}
    if other:
        raise SystemExit(f"{path} holds results of other settings ({', '.join(other)}): pass another --out")
    done = {(r["framework"], r["seed"]) for r in records if r["step"] == args.steps}
    Path(args.models_dir).mkdir(parents=True, exist_ok=True)
    base = save_base(Path(args.models_dir) / "base", demo_config(0, 1, str(out), **task(args), **args.set).model,
                     args.python)
    evaluate = None
    for seed in args.seeds:
        names = [n for n in args.frameworks if (n, seed) not in done]
        if not names:
            print(f"seed {seed}: already in {path}, skipped", flush=True)
            continue
        start = time.perf_counter()
        saved = train_seed(args, seed, names, base)
        evaluate = evaluate or evaluator(args)
        for name in names:
            new = [{"framework": name, "seed": seed, "step": s["step"], "train_seconds": s["train_seconds"],
                    "train_reward": s["train_reward"], **evaluate(s["folder"]), "settings": mine, "command": command}
                   for s in saved[name]]
            with path.open("a") as f:  # a (framework, seed) is written whole, once evaluated: resumable
                f.writelines(json.dumps(r) + "\n" for r in new)
        if not args.keep_models:
            shutil.rmtree(Path(args.models_dir) / f"seed{seed}", ignore_errors=True)
        print(f"seed {seed}: done in {time.perf_counter() - start:.0f} s", flush=True)


def override(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` (VALUE in JSON, else a string) -> (KEY, value); the key checked against grouprl's config."""
    from grouprl.config import TrainConfig

    key, sep, value = text.partition("=")
    if not sep or key not in TrainConfig.__dataclass_fields__:
        raise argparse.ArgumentTypeError(f"{text!r}: want KEY=VALUE with KEY a grouprl setting")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="training steps per framework and seed")
    parser.add_argument("--save_every", type=int, default=4, help="save (and later evaluate) every this many steps")
    parser.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    parser.add_argument("--eval_problems", type=int, default=32, help="held-out problems")
    parser.add_argument("--eval_samples", type=int, default=8, help="samples per held-out problem (temperature 1)")
    parser.add_argument("--out", default="benchmarks/results/learning", help="folder of the results")
    parser.add_argument("--report_only", action="store_true", help="rebuild md, png and last line from results.jsonl")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each worker")
    parser.add_argument("--eval_threads", type=int, default=1,
                        help="torch threads of the evaluation (two can wait on each other on a busy CPU)")
    parser.add_argument("--models_dir", help="where the saved models go (deleted once a seed is evaluated, unless "
                        "--keep_models); empty: a folder in the temporary directory named after --out, so runs into "
                        "other --out folders at the same time never share (and delete) each other's models")
    parser.add_argument("--keep_models", action="store_true")
    parser.add_argument("--trl_gradient_checkpointing", type=lambda s: s.lower() in ("1", "true", "yes"),
                        default=False, help="TRL's own default is true; the demo's (grouprl's) setting is false")
    parser.add_argument("--task_options", type=json.loads, default={},
                        help="the arithmetic task's options, in JSON, for both frameworks and the evaluation "
                        "(e.g. '{\"operands\": 3}'); empty: the demo's task")
    parser.add_argument("--python", default=sys.executable, help="interpreter with grouprl and trl installed")
    parser.add_argument("--set", action="append", default=[], type=override, metavar="KEY=VALUE",
                        help="change one of the demo's settings (VALUE in JSON; repeatable): grouprl's, and TRL's "
                             "too when it trains in this run")
    parser.add_argument("--frameworks", type=lambda s: s.split(","), default=list(FRAMEWORKS),
                        help="which to train (an ablation trains grouprl alone)")
    parser.add_argument("--compare_with", help="results folder whose other frameworks' curves the report uses")
    parser.add_argument("--ablations", help="instead: summarise every ablation folder under this one against "
                        "--compare_with (ablations.md)")
    add_smoke(parser, "grouprl alone (TRL need not be installed), one step on the tiny model, 2 held-out problems x 1 "
                      "sample, into a temporary folder")
    parser.add_argument("--worker", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--base", help=argparse.SUPPRESS)
    parser.add_argument("--evaluate", metavar="FOLDER", help=argparse.SUPPRESS)
    parser.add_argument("--save_base", nargs=2, metavar=("FOLDER", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.set = dict(args.set)
    if args.smoke:
        args.steps, args.save_every, args.seeds, args.eval_problems, args.eval_samples = 1, 1, [0], 2, 1
        args.frameworks, args.set = ["grouprl"], {"model": "tiny", **args.set}
        if not (args.worker or args.evaluate):
            args.out = tempfile.mkdtemp(prefix="learning-smoke-")
            args.models_dir = os.path.join(args.out, "models")
    if args.models_dir is None:
        name = hashlib.sha1(str(Path(args.out).resolve()).encode()).hexdigest()[:10]
        args.models_dir = os.path.join(tempfile.gettempdir(), f"learning-models-{name}")
    unknown = set(args.frameworks) - set(FRAMEWORKS)
    if unknown:
        parser.error(f"--frameworks: unknown {sorted(unknown)}; choose from {FRAMEWORKS}")
    if args.save_base:
        return write_base(Path(args.save_base[0]), args.save_base[1])
    if args.evaluate:  # one model, in a process of its own (see evaluator); its metrics are the last line
        protocol = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
        protocol.write(json.dumps(evaluate_one(args, args.evaluate)) + "\n")
        protocol.flush()
        return
    if args.worker:
        start_protocol()
        args.trl_ckpt = args.trl_gradient_checkpointing
        (grouprl_worker if args.worker == "grouprl" else trl_worker)(args)
        return
    print(cpu_line(), flush=True)
    if args.smoke:
        print("smoke: grouprl alone, one step of the tiny model; without TRL both ratios are nan", flush=True)
    if args.ablations:
        return ablations(args)
    if not args.report_only:
        python = os.path.relpath(sys.executable) if not os.path.relpath(sys.executable).startswith("..") else "python"
        run(args, shlex.join([python, *sys.argv]))
        say_peak()
    report(args, settings(args))


if __name__ == "__main__":
    main()
