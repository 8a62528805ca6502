"""Process 0's memory while it makes a rollout-server push under FSDP (``grouprl/serve/weights/stream_write.py``,
``grouprl/serve/client/collective.py``). ``--push files``: the file written one tensor at a time, as grouprl writes it,
against every tensor gathered and cast first and then written by ``safetensors.torch.save_file``, which takes the
whole state dict at once. ``--push broadcast``: a collective (nccl, gloo) push's tensors, each gathered as the
broadcast takes it (a synchronous run, as grouprl sends it), against a copy staged at the write (what sampling
ahead and LoRA need); taken one at a time as vLLM's engine takes them, without the broadcast itself. The two
ways print as ``streamed`` and ``whole``.

Two FSDP processes on gloo (CPU), a random-init Llama of ``--hidden`` x ``--layers`` (vocabulary 32000, untied
head), each decoder layer and the root sharded as a run shards them, the shards made on the meta device and
filled in place so the whole model never sits in either process. Each way runs ``--repeats`` times, each time
in fresh processes that make one push first (imports, gloo's buffers; what it freed then handed back to the
system with ``malloc_trim``) and then the measured one, as every step of a run makes one. A thread samples
process 0's resident memory every millisecond during that push; the figure is how far it rose above where the
push began (median over repeats). A file goes to ``rollout_weights_dir``'s default, /dev/shm, which is not the
process's own memory.

    python benchmarks/push_memory.py [--push files|broadcast] [--hidden 1024] [--layers 12] [--dtype bfloat16]
                                     [--repeats 3] [--seconds | --collective]

The last line is ``streamed_mib=<X> whole_mib=<Y> ratio=<Y/X> model_mib=<the push's size>``; with ``--seconds``
each way's time to write one push file in one process instead (no FSDP), ``streamed_s=<X> whole_s=<Y>
ratio=<Y/X>``; with ``--collective`` the memory of a collective push's tensors in one process, read from the
model as they are sent against staged as a copy, ``live_mib=<X> staged_mib=<Y>``.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp
from machine import cpu_line  # benchmarks/machine.py: every figure says which CPU it came from
from smoke import add_smoke, shrink

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class Peak:
    """The most resident memory above the start, sampled by a thread while the block runs."""

    def __enter__(self) -> Peak:
        self.start, self.most, self.done = rss(), 0, threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while not self.done.is_set():
            self.most = max(self.most, rss() - self.start)
            time.sleep(0.001)

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()
        self.most = max(self.most, rss() - self.start)


def sharded_model(hidden: int, layers: int, env) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    from grouprl.trainer.dist.sharding import Sharding, decoder_layers

    config = LlamaConfig(hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                         num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64, vocab_size=32000,
                         tie_word_embeddings=False)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    kwargs = Sharding().fsdp_kwargs(env)
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    model.to_empty(device="cpu")
    generator = torch.Generator().manual_seed(env.rank)
    with torch.no_grad():  # the weights a push reads (the rotary buffers, left empty, are not in the state dict)
        for p in model.parameters():
            p.to_local().normal_(0, 0.02, generator=generator)
    return model


def streamed(model, folder: Path, dtype: torch.dtype, rank: int) -> None:
    from grouprl.serve.weights.transport import reading, write_weights_file

    read = reading(model, dtype=dtype)
    with read.through():
        if rank == 0:
            write_weights_file(model, read, folder)


def whole(model, folder: Path, dtype: torch.dtype, rank: int) -> None:
    from safetensors.torch import save_file

    from grouprl.rollout.vllm_weights import full_tensors

    state = {}
    for n, t in full_tensors(model, torch.device("cpu")):  # every process gathers; process 0 keeps
        if rank == 0:
            state[n] = t.to(dtype)
    if rank == 0:
        save_file({n: t.contiguous() for n, t in state.items()}, str(folder / "model.safetensors"),
                  metadata={"format": "pt"})


def broadcast_streamed(model, folder: Path, dtype: torch.dtype, rank: int) -> None:
    """A collective push as a synchronous FSDP run makes it: each tensor gathered as the broadcast takes it
    (taken here as vLLM's engine takes them, without the broadcast)."""
    from grouprl.serve.weights.sent import StreamedWeights
    from grouprl.serve.weights.transport import reading

    read = reading(model, dtype=dtype)
    with read.through():
        if rank == 0:
            for _name, t in StreamedWeights(read, dtype):
                del t


def broadcast_staged(model, folder: Path, dtype: torch.dtype, rank: int) -> None:
    """The same push from a copy staged at the write, as sampling ahead (and LoRA) make it under FSDP."""
    from grouprl.serve.client.collective import CollectiveWeights
    from grouprl.serve.weights.transport import reading

    read = reading(model, dtype=dtype)
    with read.through():
        if rank == 0:
            sender = CollectiveWeights.__new__(CollectiveWeights)  # its write alone: no servers
            sender.stages = lambda: True
            sender.write(model, read, 1, dtype)
            for _name, t in sender.sending:
                del t


FILES = {"streamed": streamed, "whole": whole}
BROADCASTS = {"streamed": broadcast_streamed, "whole": broadcast_staged}
WAYS = {"files": FILES, "broadcast": BROADCASTS}


def worker(rank: int, world: int, store: str, kind: str, way: str, hidden: int, layers: int, dtype: str,
           out: str) -> None:
    torch.set_num_threads(1)
    from grouprl.trainer.dist.group import init_distributed

    env = init_distributed(rank=rank, world_size=world, init_method=f"file://{store}", device="cpu")
    model = sharded_model(hidden, layers, env)
    import torch.distributed as dist

    push = WAYS[kind][way]
    with tempfile.TemporaryDirectory(dir="/dev/shm") as folder:  # a first push: imports, gloo's buffers
        push(model, Path(folder), getattr(torch, dtype), rank)
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # what that push freed goes back, so the rise is not hidden in reuse
    dist.barrier()
    with tempfile.TemporaryDirectory(dir="/dev/shm") as folder, Peak() as peak:
        push(model, Path(folder), getattr(torch, dtype), rank)
    from grouprl.serve.weights.transport import reading

    size = sum(e.nbytes for e in reading(model, dtype=getattr(torch, dtype)).entries)
    if rank == 0:
        Path(out).write_text(f"{peak.most} {size}")
    dist.barrier()
    dist.destroy_process_group()


def run(way: str, args: argparse.Namespace) -> tuple[int, int]:
    with tempfile.TemporaryDirectory() as tmp:
        store, out = Path(tmp) / "store", Path(tmp) / "out"
        mp.spawn(worker, args=(2, str(store), args.push, way, args.hidden, args.layers, args.dtype, str(out)),
                 nprocs=2)
        most, size = out.read_text().split()
        return int(most), int(size)


def seconds(args: argparse.Namespace) -> dict[str, float]:
    """Each way's seconds to write one push of the same model in one process (no FSDP: no gathers), median of
    ``--repeats`` in turn."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)
    config = LlamaConfig(hidden_size=args.hidden, intermediate_size=4 * args.hidden, num_hidden_layers=args.layers,
                         num_attention_heads=args.hidden // 64, num_key_value_heads=args.hidden // 64,
                         vocab_size=32000, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    times: dict[str, list[float]] = {w: [] for w in FILES}
    for _ in range(args.repeats):
        for way, write in FILES.items():
            with tempfile.TemporaryDirectory(dir="/dev/shm") as folder:
                start = time.perf_counter()
                write(model, Path(folder), getattr(torch, args.dtype), 0)
                times[way].append(time.perf_counter() - start)
    return {w: statistics.median(v) for w, v in times.items()}


def collective(args: argparse.Namespace) -> dict[str, float]:
    """Each way's rise in resident memory (MiB, median of ``--repeats``) while a collective push is made ready and
    its tensors taken one at a time, as vLLM's engine takes them to broadcast (no server: the broadcast itself
    holds a buffer in either way), in one process: ``staged``, a copy made at the write (sampling ahead, or
    FSDP), against ``live``, the model read as it is sent (a synchronous run)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from grouprl.serve.client.collective import CollectiveWeights
    from grouprl.serve.weights.transport import reading

    config = LlamaConfig(hidden_size=args.hidden, intermediate_size=4 * args.hidden, num_hidden_layers=args.layers,
                         num_attention_heads=args.hidden // 64, num_key_value_heads=args.hidden // 64,
                         vocab_size=32000, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    rises: dict[str, list[int]] = {"staged": [], "live": []}
    for _ in range(args.repeats):
        for way in rises:
            sender = CollectiveWeights.__new__(CollectiveWeights)
            sender.stages = lambda way=way: way == "staged"
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            with Peak() as peak:
                read = reading(model)
                with read.through():
                    sender.write(model, read, 1, getattr(torch, args.dtype))
                for _name, t in sender.sending:
                    del t
                del sender
            rises[way].append(peak.most)
    return {w: statistics.median(v) / 2**20 for w, v in rises.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--push", default="files", choices=list(WAYS),
                        help="files: the file written streamed or from a whole dict; broadcast: a collective push's "
                             "tensors gathered as sent (a synchronous run) or from a copy staged at the write")
    parser.add_argument("--seconds", action="store_true", help="time each way in one process instead")
    parser.add_argument("--collective", action="store_true",
                        help="a collective push's memory in one process instead: staged copy against live reads")
    add_smoke(parser, "a model of 1 layer of width 64, one repeat")
    args = shrink(parser.parse_args(), hidden=64, layers=1, repeats=1)
    print(cpu_line())
    if args.collective:
        mib = collective(args)
        print(f"live_mib={mib['live']:.0f} staged_mib={mib['staged']:.0f}")
        return
    if args.seconds:
        took = seconds(args)
        print(f"streamed_s={took['streamed']:.3f} whole_s={took['whole']:.3f} "
              f"ratio={took['whole'] / took['streamed']:.2f}")
        return
    peaks: dict[str, list[int]] = {w: [] for w in FILES}
    size = 0
    for i in range(args.repeats):
        for way in FILES:  # in turn, so both see the same machine
            most, size = run(way, args)
            peaks[way].append(most)
            print(f"repeat {i}: {way} +{most / 2**20:.0f} MiB")
    mib = {w: statistics.median(v) / 2**20 for w, v in peaks.items()}
    print(f"streamed_mib={mib['streamed']:.0f} whole_mib={mib['whole']:.0f} "
          f"ratio={mib['whole'] / max(mib['streamed'], 1e-9):.1f} model_mib={size / 2**20:.0f}")


if __name__ == "__main__":
    main()
