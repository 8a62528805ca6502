"""Where one GRPO step's CPU time goes: PyTorch's profiler over the rollout and the update of a step at
``benchmarks/vs_trl.py``'s settings (SmolLM2-135M-Instruct, arithmetic, 4 prompts x G=4, 64 new tokens,
temperature 1, grouprl's defaults otherwise), after warm-up steps in which the engine learns its decode
layouts and ``dtype: auto`` chooses.

    python benchmarks/profile_step.py [--threads 1] [--steps 3] [--beta 0.04] [--engine auto]
    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 python benchmarks/profile_step.py   # AVX2 code paths
    python benchmarks/profile_step.py --shapes 8      # also each phase's 8 costliest operator-and-shape pairs

For each phase: its operators' self time summed into kinds (:data:`KINDS`: matrix products, attention,
casts and copies, oneDNN's weight reorders, the optimizer step, the rest), each kind's share, and the
operators that took most. The profiler's own cost is in the times, so read the shares, not the seconds.
The last line is ``rollout_products=<share> update_products=<share>``.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from machine import cpu_line  # benchmarks/machine.py: every figure says which CPU it came from
from setting import step_trainer
from smoke import add_smoke, shrink
from smoke import policy as load
from torch.profiler import ProfilerActivity, profile

KINDS = {
    "matrix products": ("aten::mm", "aten::addmm", "aten::addmm_", "mkldnn::_linear_pointwise",
                        "aten::baddbmm", "_C::onednn_mm"),
    "attention": ("aten::bmm", "aten::_softmax", "aten::_scaled_dot_product_flash_attention_for_cpu",
                  "aten::_scaled_dot_product_flash_attention_for_cpu_backward", "_C::cpu_attention_with_kv_cache",
                  "vllm::unified_attention_with_output"),
    "casts and copies": ("aten::copy_", "aten::_to_copy", "aten::clone", "aten::cat", "aten::index_select"),
    "weight reorders": ("mkldnn::_reorder_linear_weight", "_C::create_onednn_mm_handler"),
    "optimizer step": ("aten::_fused_adamw_",),
}
"""kind -> the operators whose self time counts towards it (vLLM's CPU build's own among them); every other
operator is "the rest"."""


def kind_of(name: str) -> str:
    return next((k for k, names in KINDS.items() if name in names), "the rest")


def shares(prof) -> tuple[float, dict[str, float], list[tuple[str, float]]]:
    """(total self seconds, share of each kind, the ten operators with most self time and their shares)."""
    events = [(e.key, e.self_cpu_time_total / 1e6) for e in prof.key_averages()]
    total = sum(s for _, s in events) or 1.0
    by_kind = defaultdict(float)
    for name, seconds in events:
        by_kind[kind_of(name)] += seconds / total
    top = sorted(events, key=lambda e: -e[1])[:10]
    return total, dict(by_kind), [(name, seconds / total) for name, seconds in top]


def by_shape(prof, count: int) -> list[str]:
    """The ``count`` operator-and-input-shape pairs with most self time: which tensor a cast or fill is of."""
    events = sorted(prof.key_averages(group_by_input_shape=True), key=lambda e: -e.self_cpu_time_total)[:count]
    return [f"    {e.self_cpu_time_total / 1e6:6.3f} s  {e.count:4d} x {e.key} {e.input_shapes}" for e in events]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3, help="warm-up steps before the profiled one")
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--engine", choices=["auto", "hf", "vllm"], default="auto", help="grouprl's rollout_engine")
    parser.add_argument("--shapes", type=int, default=0, help="print each phase's N costliest operator-and-shape pairs")
    add_smoke(parser, "the tiny model, the built-in engine, the first step profiled")
    args = shrink(parser.parse_args(), steps=0, engine="hf")
    print(cpu_line(), flush=True)
    torch.set_num_threads(args.threads)

    policy, tokenizer = load("smollm2-135m", args.smoke, dtype=torch.float32)
    trainer = step_trainer(policy, tokenizer, "profile", beta=args.beta, rollout_engine=args.engine)
    profiles, on = {}, [False]

    def profiled(phase, fn):
        def run(*a, **k):
            if not on[0]:
                return fn(*a, **k)
            with profile(activities=[ProfilerActivity.CPU], record_shapes=args.shapes > 0) as prof:
                out = fn(*a, **k)
            profiles[phase] = prof
            return out
        return run

    trainer.collector.collect = profiled("rollout", trainer.collector.collect)
    trainer.rule.update = profiled("update", trainer.rule.update)
    for step in range(args.steps + 1):
        on[0] = step == args.steps
        metrics, _ = trainer.step()
        trainer.step_count += 1
    c = trainer.config
    plan = trainer.rollout_plan
    print(f"engine {plan.engine}; formats: rollout {plan.rollout_format}, "
          f"training {'bf16' if c.train_bf16 else 'fp32'}; "
          f"profiled step: rollout {metrics['time/rollout']:.1f} s, update {metrics['time/update']:.1f} s "
          "(with the profiler's cost)", flush=True)
    products = {}
    for phase, prof in profiles.items():
        total, kinds, top = shares(prof)
        products[phase] = kinds.get("matrix products", 0.0)
        print(f"{phase}: {total:.2f} s of operator self time", flush=True)
        for kind in (*KINDS, "the rest"):
            print(f"  {kind:18s} {kinds.get(kind, 0.0):6.1%}")
        print("  most self time: " + ", ".join(f"{name} {share:.1%}" for name, share in top), flush=True)
        if args.shapes:
            print("  by input shape (self seconds, calls, operator, shapes):")
            print("\n".join(by_shape(prof, args.shapes)), flush=True)
    print(f"rollout_products={products['rollout']:.2f} update_products={products['update']:.2f}")


if __name__ == "__main__":
    main()
