"""Decode steps of Llama-family models as a plain loop over their layers' modules.

A ``transformers`` model's forward wraps each step in work that a one-token decode step does not need:
the causal mask built afresh, the attention function looked up per layer, keyword arguments and
output objects passed through every layer. On a CPU, where a 135M model's decode step is a few tens
of milliseconds, that glue is a share worth taking: on a 2-core AMD EPYC Zen 4, ``python
benchmarks/rollout.py --warmup 1`` (the ``engine`` against the ``engine, transformers forward`` column, log
``benchmarks/results/rollout/zen4-layer-loop.log``) gave 1.10x the tokens/s in fp32 and 1.09x in bf16 at
16 rows x 64 new tokens, where most steps have a few rows, and no difference at 64 x 128 (0.99x, 0.98x),
where the products outweigh the glue.

For the families whose layers are the plain pre-norm block (:data:`FAMILIES`, full attention only),
:class:`LayerLoop` runs the step itself: the same modules (embedding, RMSNorms, projections, rotary
embedding, activation, LM head) called in the same order on the same tensors, with the attention of
:mod:`grouprl.rollout.attention` (what the engine's decode steps use in the ``transformers`` forward
too) on the cache's own layers. Since every number goes through the same operations, the logits are
the forward's bit for bit (tested). Models of other families, sliding-window layers, a cache the model
built itself, and prefills (more than one new position per row) go through the ``transformers``
forward. LoRA layers that peft injected are modules like any other and are called as such.

Where the weights are stacked copies (a bf16 rollout's, :func:`stacked_copies`), a layer's q, k and v
projections run as one product of the stacked ``[q + k + v, E]`` weight and its gate and up projections
as one of ``[2 I, E]``: four products a layer instead of seven, each over more output columns, which the
few-row kernels run faster than the parts (SmolLM2-135M in bf16 on a 2-core Intel Xeon with AMX, a 16-row
step's products at their fastest layout: 14.3 against 15.8 ms, ``python benchmarks/products.py --threads 2
--rows 4,16``, log ``benchmarks/results/products/xeon-amx.log``). The copies are views of the
stacked tensors, so the ``transformers`` forward (prefills) reads the same memory, and a step costs no
more memory than before. Each output column is the same dot product either way.

Shapes: b rows, L cached + new positions, E hidden size, H query heads, KV key/value heads, D head
width, I MLP width, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from grouprl.rollout.attention import grouped_attention
from grouprl.rollout.cache import BufferLayer

FAMILIES = frozenset({"llama", "qwen2", "qwen3", "mistral"})
"""``config.model_type`` values whose decoder layer is the block :meth:`LayerLoop.step` computes (Qwen3's
per-head query and key norms included; the four apply rotary embeddings alike); each model's layers are
checked as well."""


STACKS = {"self_attn": ("q_proj", "k_proj", "v_proj"), "mlp": ("gate_proj", "up_proj")}
"""Per block, the projections of one input that a decode step runs as one product when their weights
are stacked."""


def stack_groups(model: nn.Module) -> list[list[str]]:
    """Names (as ``model.named_modules`` gives them) of each group of plain ``nn.Linear`` projections of
    :data:`STACKS` that can be stacked: the same input size and format, biases on all or none. LoRA-wrapped
    projections are not plain and are left alone."""
    groups = []
    for name, module in model.named_modules():
        parts = STACKS.get(name.rsplit(".", 1)[-1])
        linears = [getattr(module, p, None) for p in parts] if parts else []
        if not linears or not all(type(m) is nn.Linear for m in linears):
            continue
        if len({(m.in_features, m.weight.dtype, m.weight.device, m.bias is None) for m in linears}) == 1:
            groups.append([f"{name}.{p}" for p in parts])
    return groups


def stacked_copies(model: nn.Module, dtype: torch.dtype, groups: list[list[str]]) -> dict[str, torch.Tensor]:
    """``dtype`` copies of ``model``'s float32 parameters by name (others as they are), each of ``groups``
    (:func:`stack_groups`, or none) written into one stacked tensor whose row blocks the copies are: what
    :class:`LayerLoop` runs as one product."""
    params = dict(model.named_parameters())
    copies: dict[str, torch.Tensor] = {}
    for group in groups:
        for kind in ("weight", "bias"):
            parts = [params.get(f"{g}.{kind}") for g in group]
            if any(p is None or p.dtype != torch.float32 for p in parts):
                continue
            stacked = parts[0].new_empty(sum(p.shape[0] for p in parts), *parts[0].shape[1:], dtype=dtype)
            for g, p, rows in zip(group, parts, stacked.split([p.shape[0] for p in parts]), strict=True):
                copies[f"{g}.{kind}"] = rows.copy_(p.detach())
    for name, p in params.items():
        if name not in copies:
            copies[name] = p.to(dtype) if p.dtype == torch.float32 else p
    return copies


class StackedLinear(nn.Module):
    """Projections whose weights are consecutive row blocks of one tensor, run as one product.

    Shapes: x [..., in] -> ``split`` outputs [..., out_i]."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, sizes: list[int]):
        super().__init__()
        self.weight, self.bias, self.sizes = weight, bias, sizes  # plain tensors: the copies of one rollout
        self.out_features, self.in_features = weight.shape
        self.parts: tuple[nn.Linear, ...] = ()
        """The projections it runs (a plain tuple, not submodules)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self(x).split(self.sizes, -1)

    @classmethod
    def of(cls, linears: list[nn.Linear]) -> StackedLinear | None:
        """The stacked product of ``linears`` where their weights (and biases) are consecutive row blocks of
        one tensor, in order; None otherwise."""
        weight = _stack_of([m.weight for m in linears])
        if weight is None or not all(type(m) is nn.Linear for m in linears):
            return None
        biases = [m.bias for m in linears]
        if all(b is None for b in biases):
            bias = None
        elif (bias := _stack_of(biases)) is None:
            return None
        stack = cls(weight, bias, [m.out_features for m in linears])
        stack.parts = tuple(linears)
        return stack


def _stack_of(parts: list[torch.Tensor | None]) -> torch.Tensor | None:
    """The tensor whose consecutive leading-dimension blocks ``parts`` are, in order, filling their one
    storage; None otherwise. (Storage, not ``_base``: views made under ``torch.inference_mode``, where
    rollouts run, keep no ``_base``.)"""
    first = parts[0]
    if first is None or not first.is_contiguous():
        return None
    storage, offset = first.untyped_storage(), 0
    for p in parts:
        if p is None or not p.is_contiguous() or p.dtype != first.dtype or p.shape[1:] != first.shape[1:] or \
                p.untyped_storage().data_ptr() != storage.data_ptr() or p.storage_offset() != offset:
            return None
        offset += p.numel()
    if offset * first.element_size() != storage.nbytes():
        return None
    return first.as_strided((sum(p.shape[0] for p in parts), *first.shape[1:]), first.stride(), 0)


@dataclass
class _Stacks:
    """A layer's stacked products (None where its projections run one by one)."""

    qkv: StackedLinear | None
    gate_up: StackedLinear | None


def float_rows(logits: torch.Tensor) -> torch.Tensor:
    """``[b, V]`` logits as float32 rows. A transposed head hands over column-major logits, which the sampler
    needs as rows: one kernel casts and reorders them, where a cast then a copy would pass over them twice."""
    return logits.to(torch.float32, memory_format=torch.contiguous_format)


class LayerLoop:
    """One-token decode steps of ``model`` (a ``transformers`` causal LM, LoRA layers injected or not).

    Build it with :meth:`plan`, which returns None for a model it does not cover.
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.base = model.model
        self.head = model.lm_head
        self.stacks = [
            _Stacks(StackedLinear.of([getattr(layer.self_attn, p) for p in STACKS["self_attn"]]),
                    StackedLinear.of([getattr(layer.mlp, p) for p in STACKS["mlp"]]))
            for layer in self.base.layers]

    def stacked_linears(self) -> list[StackedLinear]:
        """The stacked products the steps run (the weights' copies of one rollout)."""
        return [s for st in self.stacks for s in (st.qkv, st.gate_up) if s is not None]

    @classmethod
    def plan(cls, model: nn.Module) -> LayerLoop | None:
        """A loop for ``model``, or None where its layers are not the block :meth:`step` computes."""
        config = getattr(model, "config", None)
        base = getattr(model, "model", None)
        if config is None or getattr(config, "model_type", None) not in FAMILIES or base is None:
            return None
        if not all(hasattr(base, n) for n in ("embed_tokens", "layers", "norm", "rotary_emb")) or \
                not isinstance(getattr(model, "lm_head", None), nn.Module):
            return None
        if getattr(config, "sliding_window", None) is not None and config.model_type == "mistral":
            return None
        for layer in base.layers:
            attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
            if attn is None or mlp is None or getattr(attn, "sliding_window", None) is not None:
                return None
            if not all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling")):
                return None
            if not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")):
                return None
            if not all(hasattr(layer, n) for n in ("input_layernorm", "post_attention_layernorm")):
                return None
        return cls(model)

    def covers(self, cache: object, ids: torch.Tensor) -> bool:
        """Whether :meth:`step` can take this call: one new position per row, on a cache of
        :class:`~grouprl.rollout.cache.BufferLayer` s, one per layer, with the model in eval mode (the loop
        has no attention dropout)."""
        layers = getattr(cache, "layers", None)
        return ids.shape[1] == 1 and not self.model.training and layers is not None and \
            len(layers) == len(self.base.layers) and all(type(c) is BufferLayer for c in layers)

    def step(self, ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
             cache: object) -> torch.Tensor:
        """Append one position per row to ``cache``; returns its logits.

        Args:
            ids: ``[b, 1]`` long.
            attention_mask: ``[b, L]`` (nonzero = attend) over the cached positions and the new one.
            position_ids: ``[b, 1]`` long.
            cache: a ``DynamicCache`` that :meth:`covers` accepts.

        Returns:
            ``[b, V]`` float32.
        """
        b = ids.shape[0]
        h = self.base.embed_tokens(ids)                                   # [b, 1, E]
        cos, sin = self.base.rotary_emb(h, position_ids)                  # [b, 1, D] each
        attend = attention_mask.bool()[:, None, None, :]                  # [b, 1, 1, L]
        for layer, kv, stacks in zip(self.base.layers, cache.layers, self.stacks, strict=True):
            attn, mlp = layer.self_attn, layer.mlp
            x = layer.input_layernorm(h)
            if stacks.qkv is not None:
                q, k, v = stacks.qkv.split(x)
            else:
                q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
            q = q.view(b, 1, -1, attn.head_dim)                           # [b, 1, H, D]
            k = k.view(b, 1, -1, attn.head_dim)                           # [b, 1, KV, D]
            v = v.view(b, 1, -1, attn.head_dim).transpose(1, 2)
            if hasattr(attn, "q_norm"):  # Qwen3 normalises each head before the rotation
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)  # [b, H | KV, 1, D]
            keys, values = kv.update(k, v)                                # [b, KV, L, D] views
            out = grouped_attention(q, keys, values, attend, attn.scaling)  # [b, 1, H, D]
            h = h + attn.o_proj(out.reshape(b, 1, -1))
            x = layer.post_attention_layernorm(h)
            gate, up = stacks.gate_up.split(x) if stacks.gate_up is not None else (mlp.gate_proj(x), mlp.up_proj(x))
            h = h + mlp.down_proj(mlp.act_fn(gate) * up)
        return float_rows(self.head(self.base.norm(h))[:, -1])
