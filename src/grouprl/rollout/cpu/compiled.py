"""The layer loop's one-token step as one ``torch.compile`` graph, inductor fusing the small operators around the
products. Its inputs are plain tensors, so fresh weight copies and a cache cut to fewer rows reuse the graph (rows
and cache length dynamic); it compiles at the first step of 2 or more rows and lives as long as the sampler.

Shapes: b rows, L cached + new positions, E hidden size, H query heads, KV key/value heads, D head width,
V vocabulary."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn
from torch.nn import functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from grouprl.rollout.attention import grouped_attention
from grouprl.rollout.cpu.layer_loop import LayerLoop, float_rows

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {  # hidden_act values it computes
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
}
PROJECTIONS = (("self_attn", "q_proj"), ("self_attn", "k_proj"), ("self_attn", "v_proj"), ("self_attn", "o_proj"),
               ("mlp", "gate_proj"), ("mlp", "up_proj"), ("mlp", "down_proj"))  # in the order the step runs them


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The Llama-family RMSNorm: normalised in float32, scaled in the input's format."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@dataclass(frozen=True)
class Plan:
    """What the compiled step computes, fixed at compile time (a change means a new graph)."""

    head_dim: int
    scaling: float
    eps: float
    head_norms: bool
    """Qwen3's per-head query and key norms."""
    activation: str


def layer_tensors(loop: LayerLoop) -> list[list[torch.Tensor | None]]:
    """Per layer: its two norms' weights, (weight, bias) of each of :data:`PROJECTIONS`, then any head norms'."""
    out = []
    for layer in loop.base.layers:
        attn = layer.self_attn
        tensors: list[torch.Tensor | None] = [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
        for block, name in PROJECTIONS:
            m = getattr(getattr(layer, block), name)
            tensors += [m.weight, m.bias]
        if hasattr(attn, "q_norm"):
            tensors += [attn.q_norm.weight, attn.k_norm.weight]
        out.append(tensors)
    return out


def decode_step(plan: Plan, ids: torch.Tensor, attention_mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                embed: torch.Tensor, layers: list[list[torch.Tensor | None]], final_norm: torch.Tensor,
                head: torch.Tensor, head_bias: torch.Tensor | None, keys: list[torch.Tensor],
                values: list[torch.Tensor]) -> torch.Tensor:
    """:meth:`LayerLoop.step` on the cache buffers: ids ``[b, 1]``, attention_mask ``[b, L]``, cos and sin
    ``[b, 1, D]``, keys and values ``[b, KV, capacity, D]`` per layer (``L - 1`` written) -> logits ``[b, V]`` fp32."""
    b, n = ids.shape[0], attention_mask.shape[1] - 1
    d, eps = plan.head_dim, plan.eps
    act = ACTIVATIONS[plan.activation]
    attend = attention_mask.bool()[:, None, None, :]                        # [b, 1, 1, L]
    h = F.embedding(ids, embed)                                             # [b, 1, E]
    for tensors, kbuf, vbuf in zip(layers, keys, values, strict=True):
        def linear(i: int, x: torch.Tensor, tensors=tensors) -> torch.Tensor:  # PROJECTIONS[i]
            return F.linear(x, tensors[2 + 2 * i], tensors[3 + 2 * i])

        x = rms_norm(h, tensors[0], eps)
        q, k, v = linear(0, x), linear(1, x), linear(2, x)
        q = q.view(b, 1, -1, d)                                             # [b, 1, H, D]
        k = k.view(b, 1, -1, d)                                             # [b, 1, KV, D]
        if plan.head_norms:
            q, k = rms_norm(q, tensors[-2], eps), rms_norm(k, tensors[-1], eps)
        q, k = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)  # [b, H | KV, 1, D]
        kbuf[:, :, n:n + 1] = k
        vbuf[:, :, n:n + 1] = v.view(b, 1, -1, d).transpose(1, 2)
        out = grouped_attention(q, kbuf[:, :, :n + 1], vbuf[:, :, :n + 1], attend, plan.scaling)  # [b, 1, H, D]
        h = h + linear(3, out.reshape(b, 1, -1))
        x = rms_norm(h, tensors[1], eps)
        h = h + linear(6, act(linear(4, x)) * linear(5, x))
    return float_rows(F.linear(rms_norm(h, final_norm, eps), head, head_bias)[:, -1])  # in its last kernel


class CompiledStep:
    """The compiled decode step of one sampler's model, kept across its rollouts."""

    FEWEST_ROWS = 2
    """Dynamo specialises a dimension of size 1: a decode loop keeps a finished row decoding rather than go eager."""

    def __init__(self) -> None:
        self.plan: Plan | None = None
        self._fn: Callable | None = None
        self.compile_seconds = 0.0
        self.unsupported: str | None = None  # why this model's steps run eagerly, once found
        self.steps = 0
        self.refused = 0  # steps the graph's guards refused (run eagerly rather than compile a second graph)
        self._logged = 0.0

    @property
    def fewest_rows(self) -> int:
        return 1 if self.unsupported is not None else self.FEWEST_ROWS

    def metrics(self) -> dict[str, float]:
        out, self._logged = {"time/compile": self.compile_seconds - self._logged}, self.compile_seconds
        return out

    def run(self, loop: LayerLoop, ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
            cache: object) -> torch.Tensor | None:
        """The step's ``[b, V]`` float32 logits with the cache advanced, or None: run it eagerly."""
        b, n = ids.shape[0], attention_mask.shape[1] - 1
        layers = cache.layers
        if self.unsupported is not None or b < self.FEWEST_ROWS or n < 2 or \
                any(kv.length != n or n + 1 > kv.capacity or kv.buffers[0].shape[0] != b for kv in layers):
            return None
        if self.plan is None:
            self.plan, self.unsupported = self._plan(loop)
            if self.unsupported is not None:
                warnings.warn(f"rollout_compile: decode steps run eagerly, the compiled step does not cover "
                              f"{self.unsupported}", stacklevel=2)
            if self.plan is None:
                return None
        base, head = loop.base, loop.head
        embed = base.embed_tokens.weight
        cos, sin = base.rotary_emb(embed, position_ids)  # [b, 1, D] each (the first argument gives the format)
        keys, values = zip(*(kv.buffers for kv in layers), strict=True)
        args = (ids, attention_mask, cos, sin, embed, layer_tensors(loop), base.norm.weight,
                head.weight, head.bias, list(keys), list(values))
        logits = self._call(args) if self._fn is not None else self._compile(args)
        if logits is None:
            return None
        for kv in layers:
            kv.advance(1)
        self.steps += 1
        return logits

    def _compile(self, args: tuple) -> torch.Tensor | None:
        """The first call: trace and compile; a failure leaves the run decoding eagerly, with a warning."""
        ids, attention_mask, cos, sin, keys, values = args[0], args[1], args[2], args[3], args[9], args[10]
        for t, dims in ((ids, (0,)), (attention_mask, (0, 1)), (cos, (0,)), (sin, (0,)),
                        *((t, (0, 2)) for t in (*keys, *values))):
            for dim in dims:
                torch._dynamo.mark_dynamic(t, dim)
        fn = torch.compile(partial(decode_step, self.plan), dynamic=False, options=inductor_options())
        start = time.perf_counter()
        try:
            logits = fn(*args)
        except Exception as e:  # noqa: BLE001 - any failure to compile is reported and decoding goes on eagerly
            self.unsupported = f"this step, which failed to compile ({type(e).__name__}: {str(e)[:300]})"
            warnings.warn(f"rollout_compile: decode steps run eagerly, {self.unsupported}", stacklevel=3)
            return None
        self.compile_seconds, self._fn = time.perf_counter() - start, fn
        return logits

    def _call(self, args: tuple) -> torch.Tensor | None:
        """A later call, through the compiled graph only (a step its guards refuse runs eagerly)."""
        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                return self._fn(*args)
        except RuntimeError as e:
            if "Detected recompile" not in str(e):
                raise
            self.refused += 1
            return None

    @staticmethod
    def _plan(loop: LayerLoop) -> tuple[Plan | None, str | None]:
        """(the plan, None), or (None, why) for a model the graph does not cover."""
        why = problem(loop)
        if why is not None:
            return None, why
        attn = loop.base.layers[0].self_attn
        return Plan(head_dim=attn.head_dim, scaling=float(attn.scaling), eps=float(loop.base.norm.variance_epsilon),
                    head_norms=hasattr(attn, "q_norm"), activation=loop.model.config.hidden_act), None


def problem(loop: LayerLoop | None) -> str | None:
    """Why the compiled step cannot run ``loop``'s model (None: it can)."""
    if loop is None:
        return "a model outside the layer loop's families (Llama, Qwen2, Qwen3, Mistral without sliding windows)"
    activation = getattr(loop.model.config, "hidden_act", None)
    if activation not in ACTIVATIONS:
        return f"the activation {activation!r}"
    layers = loop.base.layers
    norms = [loop.base.norm]
    for layer in layers:  # Qwen3's per-head norms included
        norms += [layer.input_layernorm, layer.post_attention_layernorm]
        norms += [getattr(layer.self_attn, n) for n in ("q_norm", "k_norm") if hasattr(layer.self_attn, n)]
    if any(not type(m).__name__.endswith("RMSNorm") or not hasattr(m, "variance_epsilon") for m in norms):
        return "a norm other than RMSNorm"
    if len({m.variance_epsilon for m in norms}) != 1:
        return "norms of different epsilons"
    projections = [getattr(getattr(layer, block), p) for layer in layers for block, p in PROJECTIONS]
    if any(type(m) is not nn.Linear for m in [loop.head, *projections]):
        return "projections that are not plain linear layers (LoRA)"
    return None


def inductor_options() -> dict[str, int]:
    """Inductor's CPU vector width, stated: it is not in the on-disk cache key, and a graph loaded under another
    width corrupts memory or yields NaN logits."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    return {"cpp.simdlen": pick_vec_isa().bit_width()}  # 0 where it vectorises nothing (then it picks none)


def compiler_found() -> bool:
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception:  # inductor raises its own InvalidCxxCompiler, or the import fails on a build without it
        return False
    return True
