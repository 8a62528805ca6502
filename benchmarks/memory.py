"""Where a grouprl GRPO step's memory goes, at the settings of ``benchmarks/vs_trl.py`` (SmolLM2-135M-
Instruct, arithmetic, 4 prompts x G=4, 64 new tokens, beta 0.04, ``dtype: auto``).

Two kinds of figures:

- **held** tensors, counted exactly from their sizes: the policy's weights, the frozen reference's
  (in the format ``dtype: auto`` chose for it), the gradients and AdamW's two moments;
- **transient** memory of each phase of a step (rollout: KV cache, logits; log-probs: the reference's
  forward; update: activations kept for the backward pass): how far the process's resident memory
  rose above where the phase began, sampled every 2 ms by a thread, worst over ``--steps`` steps after a
  warm-up step.

    python benchmarks/memory.py [--steps 2] [--threads 1] [--beta 0.04] [--allocator auto]
                                [--gradient_checkpointing default|true|false]
                                [--lora_rank R]

It runs under the allocator the ``grouprl`` command would preload (``--allocator auto``: tcmalloc where
installed; ``system``: the C library's malloc), starting itself again with it as the command does.

Under glibc's malloc (``--allocator system``, or no other allocator installed), the sampler also reads
``mallinfo2`` whenever resident memory reaches a new high, and prints how much of glibc's heap was in use
and how much freed but kept at the peak (set ``MALLOC_MMAP_THRESHOLD_`` in the environment to see what a
fixed threshold changes).

The last line is ``peak_rss_mib=<X> held_mib=<weights + reference + gradients + optimizer>``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import resource
import threading
import time

import torch
from machine import cpu_line, start_under_allocator
from setting import step_trainer
from smoke import add_smoke, shrink
from smoke import policy as load

PAGE = os.sysconf("SC_PAGE_SIZE")
CHECKPOINTING = {"default": None, "true": True, "false": False}  # --gradient_checkpointing -> the config's value


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def glibc_heap():
    """() -> {heap_in_use, heap_free, mapped} in MiB from glibc's ``mallinfo2``; None without glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2
    except (OSError, AttributeError):
        return None

    def read() -> dict[str, float]:
        info = libc.mallinfo2()
        return {"heap_in_use": info.uordblks / 2**20, "heap_free": info.fordblks / 2**20,
                "mapped": info.hblkhd / 2**20}

    return read


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


class PhaseWatch:
    """Samples resident memory on a thread; per phase, the most it rose above the phase's start and the
    highest resident size sampled in it."""

    def __init__(self) -> None:
        self.phase, self.start, self.rise, self.top, self.running = None, 0.0, {}, {}, True
        self.heap, self.high, self.at_high = glibc_heap(), 0.0, None
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()

    def sample(self) -> None:
        while self.running:
            phase, start = self.phase, self.start  # read once: the main thread may end the phase meanwhile
            now = rss_mib()
            if now > self.high and self.heap is not None and phase is not None:
                self.high, self.at_high = now, (phase, self.heap())
            if phase is not None:
                self.rise[phase] = max(self.rise.get(phase, 0.0), now - start)
                self.top[phase] = max(self.top.get(phase, 0.0), now)
            time.sleep(0.002)

    @contextlib.contextmanager
    def __call__(self, phase: str):
        self.phase, self.start = phase, rss_mib()
        try:
            yield
        finally:
            self.phase = None


def mib(tensors) -> float:
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--engine", default="auto", choices=["auto", "hf", "vllm"], help="rollout_engine")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed (prompts and sampling)")
    parser.add_argument("--micro_batch_size", type=int, default=8, help="rows per training pass (the default 8)")
    parser.add_argument("--gradient_checkpointing", choices=list(CHECKPOINTING), default="default",
                        help="recompute each decoder layer's activations in the backward pass (default: the "
                             "config's own, on)")
    parser.add_argument("--allocator", default="auto", help="as grouprl's allocator setting (auto, system, ...)")
    parser.add_argument("--lora_rank", type=int, default=0, help="train LoRA adapters of this rank (0: full weights)")
    add_smoke(parser, "the tiny model, the built-in engine, one warm-up and one measured step")
    args = shrink(parser.parse_args(), steps=1, threads=1, engine="hf")
    from grouprl.run.allocator import running

    start_under_allocator(args.allocator, args.threads)
    rows = [("Python, torch, transformers (after import)", None)]
    import transformers  # noqa: F401 - counted in the first row

    import grouprl.trainer.trainer  # noqa: F401 - counted in the first row, not in the setup
    from grouprl.run import logs

    rows[0] = (rows[0][0], rss_mib())
    policy, tokenizer = load("smollm2-135m", args.smoke, dtype=torch.float32)
    with torch.no_grad():  # page the weights in: loaded memory-mapped, they would count where first read
        for p in policy.parameters():
            p.view(-1)[::1024].sum()
    before_setup = rss_mib()
    trainer = step_trainer(policy, tokenizer, "memory", beta=args.beta, rollout_engine=args.engine,
                           micro_batch_size=args.micro_batch_size, seed=args.seed, lora_rank=args.lora_rank,
                           gradient_checkpointing=CHECKPOINTING[args.gradient_checkpointing])
    setup = rss_mib() - before_setup
    watch = PhaseWatch()
    original = logs.PhaseTimer.__call__

    @contextlib.contextmanager
    def watched(self, phase):
        with original(self, phase), watch(phase):
            yield

    logs.PhaseTimer.__call__ = watched
    trainer.step()  # warm-up: allocator pools, the optimizer's state
    watch.rise.clear()
    watch.top.clear()
    watch.high, watch.at_high = 0.0, None
    seconds = []
    for _ in range(args.steps):
        start = time.perf_counter()
        trainer.step()
        seconds.append(time.perf_counter() - start)
    watch.running = False
    reference = trainer.passes.reference
    optimizer = trainer.rule.optimizer
    held = [
        (f"policy weights ({', '.join(sorted({str(p.dtype) for p in policy.parameters()}))})",
         mib(policy.parameters())),
        (f"reference weights ({next(reference.parameters()).dtype})" if reference is not None
         else "reference weights (none: beta 0)", mib(reference.parameters()) if reference is not None else 0.0),
        # one per trainable parameter, in its format, from the update's first backward pass to its end (freed then)
        ("gradients (during the update)", mib(p for p in policy.parameters() if p.requires_grad)),
        ("AdamW moments (fp32)", mib(v for s in optimizer.state.values() for v in s.values()
                                     if torch.is_tensor(v) and v.dim() > 0)),
    ]
    engine = trainer.setup.get("rollout_engine", trainer.config.rollout_engine)
    held.append((f"rollout engine: {engine} (its libraries, weights and KV cache at start, when it keeps its own; "
                 "vLLM on a CPU frees its KV cache and weights from each rollout's end to its next generation)",
                 max(0.0, setup - held[1][1])))
    freed_cache = getattr(trainer.sampler, "freed_cache", None)
    if freed_cache is not None:  # the trainer's last step left the engine resting: its cache, counted
        held.append(("of which the KV cache, freed during log-probs and update", sum(freed_cache) / 2**20))
    transient = [(f"{phase} (rise above its start; highest resident size in it {watch.top[phase]:.0f})", rise)
                 for phase, rise in sorted(watch.rise.items())]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    command = (f"python benchmarks/memory.py --steps {args.steps} --threads {args.threads} --beta {args.beta} "
               f"--engine {args.engine} --micro_batch_size {args.micro_batch_size} --seed {args.seed} "
               f"--allocator {args.allocator}" + f" --gradient_checkpointing {args.gradient_checkpointing}"
               + (f" --lora_rank {args.lora_rank}" if args.lora_rank else ""))
    lines = [cpu_line(), "", f"`{command}`", "", "| what | MiB |", "|---|---|",
             f"| {rows[0][0]} | {rows[0][1]:.0f} |"]
    lines += [f"| held: {name} | {value:.0f} |" for name, value in held]
    lines += [f"| transient: {name} | {value:.0f} |" for name, value in transient]
    lines.append(f"| **peak resident memory of the process** | **{peak:.0f}** |")
    mean = sum(seconds) / len(seconds)
    lines.append(f"\nseconds per step: {', '.join(f'{x:.2f}' for x in seconds)} (mean {mean:.2f})")
    print("\n".join(lines))
    if watch.at_high is not None and running() is None:  # under another allocator glibc's heap holds nothing
        phase, heap = watch.at_high
        print(f"glibc at the highest resident size sampled ({watch.high:.0f} MiB, in {phase}): heap in use "
              f"{heap['heap_in_use']:.0f} MiB, heap freed but kept {heap['heap_free']:.0f} MiB, mapped blocks "
              f"{heap['mapped']:.0f} MiB")
    print(f"peak_rss_mib={peak:.0f} held_mib={sum(v for _, v in held):.0f}")


if __name__ == "__main__":
    main()
