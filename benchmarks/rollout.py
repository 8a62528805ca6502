"""Rollout speed on the bundled SmolLM2-135M-Instruct: the built-in engine, vLLM (when installed) and
``model.generate``, each in fp32 and bf16 (the built-in engine in the weight-only format bf16-weights
too, :mod:`grouprl.rollout.cpu.weight_only`), at 16 rows x 64 new tokens and 64 rows x 128; and the built-in
engine with its decode steps through the model's ``transformers`` forward (what its layer loop,
:mod:`grouprl.rollout.cpu.layer_loop`, gains), and with ``rollout_compile``'s compiled decode steps
(:mod:`grouprl.rollout.cpu.compiled`).

    python benchmarks/rollout.py [--repeats 2] [--warmup 0] [--threads 2] [--settings 16x64,64x128]
                                 [--allocator auto] [--device auto]

On a machine with a GPU (``--device auto`` picks it) every method runs there: the built-in engine and
``model.generate`` on the model moved to the GPU, vLLM with its GPU build.

``model.generate`` in bf16 runs a bf16 copy of the model (what loading it with ``torch_dtype=torch.bfloat16``
gives, its fastest bf16 here); its row ``generate, bf16 autocast`` runs the float32 model under bf16 autocast,
which casts every weight at every step (bf16 only: its fp32 is the ``generate`` row's).

Rows are arithmetic prompts x G=4 samples, temperature 1, no top-k/top-p, stopping on EOS only;
tokens/s counts completion tokens up to and including EOS (what a trainer uses), so a method that
keeps decoding finished rows pays for them. The compiled steps are compiled in their first rollout, as a
training run does on its first step; ``--warmup N`` runs N whole rollouts per method and format before the
timed ones, to measure them once they have settled. The methods take their rollouts in turn, so that load
from other processes falls on all alike; each figure is the total tokens over the total seconds of
``--repeats`` rollouts. A method's best format is its faster one here, and ``model.generate``'s best is the
fastest of its rows. The last line is
``speedup=<what rollout_engine, rollout_compile and dtype auto pick, over model.generate at its best format>``
at the first setting, and the table's other ratios are printed above it.

On a machine shared with other jobs the timings swing by several times from run to run: two
OpenMP workers need both cores at every matrix product and wait for each other when another job
holds one; compare only figures from one run.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import time
from unittest import mock

import torch
from machine import start_under_allocator  # benchmarks/machine.py: every figure names its CPU
from smoke import add_smoke, policy, shrink

from grouprl.models.precision import resolve_formats
from grouprl.rollout.cpu.layer_loop import LayerLoop
from grouprl.rollout.engines import resolve_compile, resolve_engine
from grouprl.rollout.formats import FORMATS as FORMATS_BY_NAME
from grouprl.rollout.sampler import Sampler
from grouprl.types import SamplingParams

G = 4
FORMATS = ("fp32", "bf16", "bf16-weights")


FORWARD = "engine, transformers forward"
"""The engine without its layer loop (CPU rows)."""
COMPILED = "engine, compiled steps"
"""The engine with ``rollout_compile`` (CPU rows): compiled in its first rollout of a format, so its figures are
the compiled step's only with ``--warmup 1`` or more."""


def through_forward(run):
    """``run`` with the engine's decode steps through the model's ``transformers`` forward (no layer loop)."""
    def wrapped(*args):
        with mock.patch.object(LayerLoop, "plan", classmethod(lambda cls, model: None)):
            return run(*args)
    return wrapped


def prompts(rows: int) -> list[str]:
    return [f"What is {a}+{b}? Answer with just the number." for a, b in
            [(7 + i, (3 * i) % 10 + 1) for i in range(rows // G)]]


def finished() -> float:
    """The clock once the GPU's queued work (if any) is done."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def run_engine(sampler: Sampler, ids: list[list[int]], n: int, fmt: str, seed: int) -> tuple[int, float]:
    """(tokens, seconds) of one built-in engine rollout."""
    params = SamplingParams(max_new_tokens=n, temperature=1.0, format=fmt)
    start = finished()
    batch = sampler.generate(ids, G, params, seed=seed)
    return int(batch.lengths.sum()), finished() - start


def run_vllm(engine, ids: list[list[int]], n: int, fmt: str, seed: int) -> tuple[int, float]:
    """(tokens, seconds) of one vLLM rollout (an engine per format)."""
    params = SamplingParams(max_new_tokens=n, temperature=1.0)
    start = finished()
    batch = engine[fmt].generate(ids, G, params, seed=seed)
    return int(batch.lengths.sum()), finished() - start


def run_generate(model, tokenizer, ids: list[list[int]], n: int, autocast: bool, seed: int) -> tuple[int, float]:
    """(tokens, seconds) of one ``model.generate`` rollout of the same B = P*G rows (under bf16 autocast where
    ``autocast``)."""
    eos = tokenizer.eos_token_id
    width = max(map(len, ids))
    rows = [r for r in ids for _ in range(G)]
    device = next(model.parameters()).device
    inp = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows], device=device)
    attn = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    torch.manual_seed(seed)
    amp = torch.autocast(device.type, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    start = finished()
    with amp:
        out = model.generate(input_ids=inp, attention_mask=attn, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=n, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    seconds = finished() - start
    comp = out[:, width:]
    is_eos = comp == eos
    lengths = torch.where(is_eos.any(1), is_eos.float().argmax(1) + 1, comp.shape[1])
    return int(lengths.sum()), seconds


AUTOCAST = "generate, bf16 autocast"
"""``model.generate`` on the float32 model under bf16 autocast: a bf16-only row."""


def runs(method: str, fmt: str) -> bool:
    """Whether ``method`` has a figure in ``fmt``: the weight-only formats (:mod:`grouprl.rollout.cpu.weight_only`)
    are the built-in engine's eager decode steps only, which bypass the compiled step."""
    if FORMATS_BY_NAME.get(fmt).weight_only is not None:
        return method in ("engine", FORWARD)
    return method != AUTOCAST or fmt == "bf16"


def built_in_methods(model, tokenizer, sampler: Sampler, device: torch.device) -> dict:
    """The built-in engine's rows and ``model.generate``'s: name -> run(ids, n, fmt, seed)."""
    methods = {"engine": lambda ids, n, fmt, seed: run_engine(sampler, ids, n, fmt, seed)}
    if device.type == "cpu":  # the layer loop and compiled steps serve CPUs only: elsewhere these rows run one code
        forward = Sampler(model, tokenizer)
        methods[FORWARD] = through_forward(lambda ids, n, fmt, seed: run_engine(forward, ids, n, fmt, seed))
        compiled = {f: Sampler(model, tokenizer, compile_steps=True) for f in FORMATS if runs(COMPILED, f)}
        methods[COMPILED] = lambda ids, n, fmt, seed: run_engine(compiled[fmt], ids, n, fmt, seed)
        methods[COMPILED].samplers = compiled
    else:
        print("the engine's layer loop and compiled steps serve CPUs only: one engine row here", flush=True)
    bf16_model = copy.deepcopy(model).to(torch.bfloat16)
    methods["generate"] = lambda ids, n, fmt, seed: run_generate(bf16_model if fmt == "bf16" else model, tokenizer,
                                                                 ids, n, False, seed)
    methods[AUTOCAST] = lambda ids, n, fmt, seed: run_generate(model, tokenizer, ids, n, True, seed)
    return methods


def timed(methods: dict, ids: list[list[int]], n: int, formats: tuple[str, ...], repeats: int) -> tuple[dict, dict]:
    """(tokens/s per (method, format), each method's faster format): the methods take their rollouts in turn."""
    totals = {(m, f): [0, 0.0] for m in methods for f in formats if runs(m, f)}
    for seed in range(repeats):
        for key in totals:
            tokens, seconds = methods[key[0]](ids, n, key[1], seed)
            totals[key][0] += tokens
            totals[key][1] += seconds
    rate = {k: t / s for k, (t, s) in totals.items()}
    best = {m: max((f for f in formats if runs(m, f)), key=lambda f, m=m: rate[m, f], default=None) for m in methods}
    return rate, best


def report(methods: dict, formats: tuple[str, ...], rate: dict, best: dict) -> None:
    """The table of one setting and the engine's ratios to its variants."""
    for m in methods:
        if best[m] is None:
            continue
        figures = "  ".join(f"{f} {rate[m, f]:7.1f}" if runs(m, f) else f"{f} {'-':>7s}" for f in formats)
        print(f"  {m:28s} {figures}  best {best[m]}", flush=True)
    for fmt in formats if FORWARD in methods else ():
        gain = rate["engine", fmt] / rate[FORWARD, fmt]
        print(f"  layer loop, {fmt}: {gain:.2f}x the engine through the transformers forward", flush=True)
        if not runs(COMPILED, fmt):
            continue
        step = methods[COMPILED].samplers[fmt].compiled
        print(f"  compiled steps, {fmt}: {rate[COMPILED, fmt] / rate['engine', fmt]:.2f}x the engine (compiled in "
              f"{step.compile_seconds:.1f} s, {step.steps} steps compiled, {step.refused} refused)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="rollouts per method, format and setting")
    parser.add_argument("--warmup", type=int, default=0, help="whole rollouts per method and format before them")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--settings", default="16x64,64x128", help="rows x new tokens, comma-separated")
    parser.add_argument("--formats", default=",".join(FORMATS),
                        help="number formats to time (fp32 alone where bf16 products are emulated and slow)")
    parser.add_argument("--no_vllm", action="store_true", help="leave vLLM out even where it is installed")
    parser.add_argument("--device", default="auto", help="auto (a GPU where there is one), cpu or cuda")
    parser.add_argument("--allocator", default="auto", help="as grouprl's allocator setting (auto: what the grouprl "
                        "command preloads, tcmalloc where installed; system: the C library's malloc)")
    add_smoke(parser, "the tiny model, 4 rows x 4 new tokens, fp32, no vLLM, one rollout per method")
    args = shrink(parser.parse_args(), repeats=1, warmup=0, threads=1, settings="4x4", formats="fp32", no_vllm=True)
    start_under_allocator(args.allocator, args.threads)  # as the grouprl command starts itself
    device = torch.device(args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        print(f"gpu: {torch.cuda.get_device_name(device)} (torch {torch.__version__})", flush=True)
    model, tokenizer = policy("smollm2-135m", args.smoke, dtype=torch.float32)
    model.to(device)
    sampler = Sampler(model, tokenizer)
    settings = [tuple(map(int, s.split("x"))) for s in args.settings.split(",")]
    formats = tuple(f for f in FORMATS if f in args.formats.split(","))
    methods = built_in_methods(model, tokenizer, sampler, device)
    engines = {}
    if importlib.util.find_spec("vllm") is not None and not args.no_vllm:
        from grouprl.rollout.vllm import VLLMSampler

        longest = max(n for _, n in settings) + 64
        engines = {fmt: VLLMSampler(model, tokenizer, max_model_len=longest, dtype=d,
                                    max_rows=max(rows for rows, _ in settings))
                   for fmt, d in (("fp32", "float32"), ("bf16", "bfloat16")) if fmt in formats}
        methods["vllm"] = lambda ids, n, fmt, seed: run_vllm(engines, ids, n, fmt, seed)
    else:
        print("vLLM left out (not installed, or --no_vllm): built-in engine and model.generate only", flush=True)
    first = None
    for rows, n in settings:
        ids = sampler.encode(prompts(rows))
        for name, run in methods.items():  # warm-up: first-call allocations and lazy imports
            for fmt in (f for f in formats if runs(name, f)):
                run(ids, 4, fmt, 0)
                for seed in range(args.warmup):
                    run(ids, n, fmt, args.repeats + seed)
        rate, best = timed(methods, ids, n, formats, args.repeats)
        decided = resolve_formats("auto", "auto", "auto", device=device)
        print(f"dtype auto: {decided.describe()}", flush=True)
        chosen = decided.rollout
        chosen = chosen if chosen in formats else best["engine"]
        # what rollout_engine auto and rollout_compile auto run in the chosen format
        compiles = COMPILED in methods and resolve_compile(None, "auto", chosen, model)[0]
        auto_engine = {"hf": COMPILED if compiles else "engine", "vllm": "vllm"}[
            resolve_engine("auto", model, "sample", compile_steps=compiles, rollout_format=chosen)[0]]
        auto_engine = auto_engine if auto_engine in methods else "engine"
        print(f"{rows} rows x {n} new tokens (tokens/s):", flush=True)
        report(methods, formats, rate, best)
        auto = rate[auto_engine, chosen]
        generate = max(rate[m, best[m]] for m in ("generate", AUTOCAST) if best[m] is not None)
        print(f"  auto ({auto_engine}, {chosen}) over generate at its best: {auto / generate:.2f}x; over the built-in "
              f"engine at its best: {auto / rate['engine', best['engine']]:.2f}x", flush=True)
        first = first or auto / generate
    for engine in engines.values():
        engine.close()
    print(f"speedup={first:.2f}")


if __name__ == "__main__":
    main()
