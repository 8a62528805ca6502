"""grouprl's GRPO step against TRL's on one device, at model sizes people train: where the time and memory go.

Both frameworks train the same random-init model of a named shape (a ``LlamaConfig``; nothing is downloaded:
the config plus the bundled SmolLM2 tokenizer, vocabulary 49,152) on the same prompts, with a reward that hashes
the completion's text (so both score alike and a random model's completions all run to the token limit: both
decode the same number of tokens), at the same settings: P prompts x G completions, N new tokens, temperature 1,
mu = 1, beta, lr 1e-6, the paper's per-sequence aggregation, bf16 where the device has bf16 units. Each framework
runs in its own process, one after the other (each owns the device and its own peak memory); the first step is a
warm-up, the figures are medians of the rest.

    python benchmarks/gpu_step.py --shape 1.7b                       # grouprl and TRL at their defaults
    python benchmarks/gpu_step.py --shape 1.7b --trl_checkpointing false   # TRL without recomputation
    python benchmarks/gpu_step.py --shape 8b --lora_rank 16          # LoRA where full fine-tuning does not fit
    python benchmarks/gpu_step.py --shape 1.7b --vllm                # vLLM rollouts on both sides (TRL colocate)
    python benchmarks/gpu_step.py --shape 1.7b --frameworks grouprl --profile /tmp/prof   # one step's trace
    python benchmarks/gpu_step.py --shape tiny --prompts 2 --group 4 --new_tokens 16      # a CPU smoke run

Per step: the whole step, generation, the training half (log-prob passes + update), and the update's model FLOPs
utilisation against the card's dense bf16 peak (6 x trained-matmul parameters x tokens for the update's forward
and backward; LoRA counts 4 x, the frozen weights' backward through activations only, plus the adapters' 6 x;
n/a where the card's peak is not in :data:`PEAK_BF16`). Peak allocated and reserved memory on a GPU, peak RSS on
a CPU. ``--profile DIR`` writes a Chrome trace of one step after the warm-up and prints the top operators by
device time. The last line is ``step_ratio=<TRL s / grouprl s> train_ratio=<TRL training half / grouprl's>
memory_ratio=<grouprl peak reserved / TRL's>``. Needs ``benchmarks/requirements.txt`` (TRL); ``--vllm`` needs vLLM.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from machine import cpu_line
from smoke import add_smoke, shrink

SHAPES = {  # hidden, layers, heads, kv heads, MLP width, tied embeddings
    "tiny": (256, 2, 4, 4, 512, True),          # head_dim 64: vLLM's CPU attention refuses 16
    "135m": (576, 30, 9, 3, 1536, True),        # SmolLM2-135M
    "0.5b": (896, 24, 14, 2, 4864, True),       # Qwen2.5-0.5B's decoder
    "1.7b": (2048, 24, 32, 32, 8192, True),     # SmolLM2-1.7B
    "8b": (4096, 32, 32, 8, 14336, False),      # Llama-3.1-8B's decoder
}
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12, "L4": 121e12}
"""Dense bf16 tensor-core peak FLOP/s by card name (SXM figures for H100: a PCIe H100 is about 0.76x)."""
PROMPTS = [f"Write a short story about the number {i}." for i in range(256)]


def model_config(shape: str):
    from transformers import LlamaConfig

    hidden, layers, heads, kv, width, tied = SHAPES[shape]
    return LlamaConfig(vocab_size=49152, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=kv, intermediate_size=width, max_position_embeddings=4096,
                       tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2, pad_token_id=2)


def hashed_reward(prompts, completions, **_):
    """A score in [0, 1) from the text alone: both frameworks reward alike, and groups disagree."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [int(hashlib.sha1(t.encode()).hexdigest()[:8], 16) / 2**32 for t in texts]


def matmul_params(model) -> tuple[int, int]:
    """(parameters of the linear layers a token's forward multiplies by, incl. the LM head; trainable ones)."""
    import torch

    total = trainable = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            total += module.weight.numel()
            trainable += sum(p.numel() for p in module.parameters(recurse=False) if p.requires_grad)
    return total, trainable


class Device:
    """Synchronised timing and peak memory on whichever device the worker runs."""

    def __init__(self):
        import torch

        self.torch, self.cuda = torch, torch.cuda.is_available()

    def now(self) -> float:
        if self.cuda:
            self.torch.cuda.synchronize()
        return time.perf_counter()

    def peaks(self) -> dict:
        if self.cuda:
            gib = 2**30
            return {"peak_allocated_gib": self.torch.cuda.max_memory_allocated() / gib,
                    "peak_reserved_gib": self.torch.cuda.max_memory_reserved() / gib}
        from grouprl.run.logs import peak_rss_mb

        return {"peak_rss_gib": peak_rss_mb() / 1024}

    def name(self) -> str:
        return self.torch.cuda.get_device_name() if self.cuda else cpu_line()


def emit(record: dict) -> None:
    print("@@" + json.dumps(record), flush=True)


def new_model(args, dtype):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grouprl.models import bundled_model_folder

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(bundled_model_folder("smollm2-135m"))
    model = AutoModelForCausalLM.from_config(model_config(args.shape), dtype=dtype)
    return model, tokenizer


def grouprl_worker(args, device: Device) -> None:
    import torch

    from grouprl.trainer.config import GRPOConfig
    from grouprl.trainer.trainer import GRPOTrainer

    model, tokenizer = new_model(args, torch.float32)
    config = GRPOConfig(prompts_per_step=args.prompts, group_size=args.group, max_new_tokens=args.new_tokens,
                        temperature=1.0, beta=args.beta, mu=1, lr=1e-6, seed=0, lora_rank=args.lora_rank,
                        micro_batch_size=args.micro_batch_size, rollout_engine="vllm" if args.vllm else "hf",
                        output_dir=tempfile.mkdtemp(prefix="gpu_step-"), progress=False,
                        log_completions_every=0, save_every=0)
    processes = None
    if device.cuda:  # as `grouprl train` places a one-GPU run: a process group of one (grouprl.cli.launch)
        from grouprl.trainer.dist.group import init_distributed, one_process_init_method
        from grouprl.trainer.dist.processes import Processes

        env = init_distributed(rank=0, world_size=1, init_method=one_process_init_method(), device="cuda")
        processes = Processes(env, config)
    trainer = GRPOTrainer(config, policy=model, tokenizer=tokenizer, reward_fns=[hashed_reward],
                          train_data=[{"prompt": p} for p in PROMPTS], processes=processes)
    emit({"ready": True, "setup": getattr(trainer, "setup", {}), "params": matmul_params(trainer.policy)})

    def step() -> dict:
        start = device.now()
        metrics, _ = trainer.step()
        seconds = device.now() - start
        trainer.step_count += 1
        return {"seconds": seconds, "generate": metrics["time/rollout"],
                "train_half": seconds - metrics["time/rollout"], "logprobs": metrics["time/logprobs"],
                "tokens": metrics["rollout/len_mean"] * args.prompts * args.group}

    run_steps(args, device, step)


def trl_worker(args, device: Device) -> None:
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer = new_model(args, torch.float32)
    folder = tempfile.mkdtemp(prefix="gpu_step-model-")  # TRL builds its reference from the model's path
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    extra = {} if args.trl_checkpointing == "default" else {"gradient_checkpointing": args.trl_checkpointing == "true"}
    if args.vllm:
        extra.update(use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=True)
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="gpu_step-trl-"), per_device_train_batch_size=args.prompts * args.group,
        num_generations=args.group, max_completion_length=args.new_tokens, temperature=1.0, top_p=1.0, top_k=0,
        beta=args.beta, num_iterations=1, learning_rate=1e-6, lr_scheduler_type="constant", loss_type="grpo",
        use_cpu=not device.cuda, bf16=device.cuda, report_to=[], logging_steps=1, save_strategy="no",
        max_steps=args.steps, disable_tqdm=True, seed=0, log_completions=False, shuffle_dataset=False, **extra)
    peft_config = None
    if args.lora_rank:
        from peft import LoraConfig

        peft_config = LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank, target_modules="all-linear")
    trainer = GRPOTrainer(model=folder, reward_funcs=[hashed_reward], args=config, peft_config=peft_config,
                          train_dataset=Dataset.from_dict({"prompt": PROMPTS}), processing_class=tokenizer)
    phases = {"generate": 0.0, "logprobs": 0.0}

    def timed(name, fn, when=lambda: True):
        def wrapper(*a, **kw):
            if not when():
                return fn(*a, **kw)
            start = device.now()
            try:
                return fn(*a, **kw)
            finally:
                phases[name] += device.now() - start
        return wrapper

    trainer._generate = timed("generate", trainer._generate)
    trainer._get_per_token_logps_and_entropies = timed(
        "logprobs", trainer._get_per_token_logps_and_entropies, lambda: not torch.is_grad_enabled())
    emit({"ready": True, "setup": {"gradient_checkpointing": config.gradient_checkpointing, "bf16": config.bf16},
          "params": matmul_params(trainer.model)})
    # TRL's loop owns its steps: time them from a callback instead of calling a step function.
    from transformers import TrainerCallback

    class Timer(TrainerCallback):
        start = 0.0
        count = 0

        def on_step_begin(self, *a, **kw):
            phases.update(generate=0.0, logprobs=0.0)
            self.start = device.now()

        def on_step_end(self, *a, **kw):
            seconds = device.now() - self.start
            length = trainer._metrics["train"]["completions/mean_length"][-1]
            emit({"step": self.count, "seconds": seconds, **phases, "train_half": seconds - phases["generate"],
                  "tokens": length * args.prompts * args.group, **device.peaks()})
            self.count += 1

    trainer.add_callback(Timer())
    if args.profile:
        print("--profile traces grouprl's steps only; TRL's run unprofiled", flush=True)
    trainer.train()


def run_steps(args, device: Device, step) -> None:
    """``args.steps`` steps, the second one profiled when --profile is set."""
    for i in range(args.steps):
        if args.profile and i == 1:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.cuda else [])
            with profile(activities=activities) as prof:
                record = step()
            write_profile(args, prof, device)
        else:
            record = step()
        emit({"step": i, **record, **device.peaks()})


def write_profile(args, prof, device: Device) -> None:
    os.makedirs(args.profile, exist_ok=True)
    prof.export_chrome_trace(os.path.join(args.profile, f"{args.worker}-step.json"))
    key = "self_cuda_time_total" if device.cuda else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=25)
    with open(os.path.join(args.profile, f"{args.worker}-top-ops.txt"), "w") as f:
        f.write(table)
    print(table, flush=True)


# -- the parent ----------------------------------------------------------------------------------------------------
def run_worker(framework: str, args) -> tuple[dict, list[dict]]:
    argv = [sys.executable, __file__, "--worker", framework, *sys.argv[1:]]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.run(argv, stdout=subprocess.PIPE, text=True, env=env)
    records = [json.loads(line[2:]) for line in proc.stdout.splitlines() if line.startswith("@@")]
    if proc.returncode or not records:
        print(proc.stdout[-4000:])
        raise SystemExit(f"the {framework} worker failed (status {proc.returncode}); its output is above")
    return records[0], [r for r in records[1:] if "step" in r]


def median(steps: list[dict], key: str) -> float:
    return statistics.median(s[key] for s in steps)


def summary(framework: str, ready: dict, steps: list[dict], args, device_name: str) -> dict:
    timed = steps[1:] or steps  # the first step is a warm-up (compilation, allocator growth)
    total, trainable = ready["params"]
    tokens = median(timed, "tokens") + args.prompts * args.group * 16  # completions + ~16 prompt tokens each
    flops = (6 * trainable + 4 * (total - trainable)) * tokens  # the update's forward and backward
    peak = next((v for k, v in PEAK_BF16.items() if k in device_name), None)
    update = median(timed, "train_half") - median(timed, "logprobs")
    row = {"framework": framework, "step_s": median(timed, "seconds"), "generate_s": median(timed, "generate"),
           "train_half_s": median(timed, "train_half"), "logprobs_s": median(timed, "logprobs"), "update_s": update,
           "mfu_update": flops / (update * peak) if peak and update > 0 else None}
    memory = {k: max(s[k] for s in steps) for k in steps[-1] if k.startswith("peak_")}
    return {**row, **memory, "setup": ready.get("setup")}


def versions() -> str:
    import importlib.metadata as meta

    names = ("torch", "transformers", "trl", "peft", "vllm")
    def version(name: str) -> str | None:
        try:
            return meta.version(name)
        except meta.PackageNotFoundError:
            return None

    return ", ".join(f"{name} {version(name)}" for name in names if version(name))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1.7b")
    parser.add_argument("--frameworks", default="grouprl,trl")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new_tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=4, help="steps per framework; the first is a warm-up")
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--micro_batch_size", type=int, default=16)
    parser.add_argument("--lora_rank", type=int, default=0)
    parser.add_argument("--trl_checkpointing", choices=("default", "true", "false"), default="default")
    parser.add_argument("--vllm", action="store_true", help="vLLM rollouts on both sides")
    parser.add_argument("--profile", default="", help="folder for one step's trace and top operators")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    add_smoke(parser, "grouprl alone (TRL need not be installed), the tiny shape, 2 prompts x 2 completions x 4 "
                      "new tokens, a warm-up and one timed step")
    args = shrink(parser.parse_args(), shape="tiny", frameworks="grouprl", prompts=2, group=2, new_tokens=4, steps=2,
                  micro_batch_size=4, lora_rank=0, vllm=False, profile="")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
    if args.worker:
        device = Device()
        {"grouprl": grouprl_worker, "trl": trl_worker}[args.worker](args, device)
        return
    device_name = Device().name()
    print(f"device: {device_name}\n{cpu_line()}\n{versions()}")
    print(f"shape {args.shape}: {args.prompts} prompts x {args.group} completions x {args.new_tokens} new tokens, "
          f"beta {args.beta}, lora_rank {args.lora_rank}, vllm {args.vllm}", flush=True)
    rows = {}
    for framework in args.frameworks.split(","):
        ready, steps = run_worker(framework, args)
        rows[framework] = summary(framework, ready, steps, args, device_name)
        print(json.dumps(rows[framework]), flush=True)
    print(table(list(rows.values())))
    if args.smoke:
        print(f"grouprl_step_s={rows['grouprl']['step_s']:.2f} (smoke: grouprl alone, the tiny shape)")
    if {"grouprl", "trl"} <= set(rows):
        ours, theirs = rows["grouprl"], rows["trl"]
        key = "peak_reserved_gib" if "peak_reserved_gib" in ours else "peak_rss_gib"
        print(f"step_ratio={theirs['step_s'] / ours['step_s']:.2f} "
              f"train_ratio={theirs['train_half_s'] / ours['train_half_s']:.2f} "
              f"memory_ratio={ours[key] / theirs[key]:.2f}")


def table(rows: list[dict]) -> str:
    keys = [k for k in rows[0] if k not in ("framework", "setup")]
    lines = ["| framework | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for row in rows:
        cells = ["n/a" if row.get(k) is None else f"{row[k]:.3f}" for k in keys]
        lines.append(f"| {row['framework']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
