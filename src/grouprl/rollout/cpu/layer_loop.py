"""Decode steps of Llama-family models as a plain loop over their layers' modules, without the forward's masks,
lookups and output objects: the same modules on the same tensors, so the logits are the forward's bit for bit.
Other families, sliding windows and prefills go through the forward.

Shapes: b rows, L cached + new positions, E hidden size, H query heads, KV key/value heads, D head width,
V vocabulary."""

from __future__ import annotations

import torch
from torch import nn
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from grouprl.rollout.attention import grouped_attention
from grouprl.rollout.cache import BufferLayer

FAMILIES = frozenset({"llama", "qwen2", "qwen3", "mistral"})  # model types whose decoder layer LayerLoop.step computes


def float_rows(logits: torch.Tensor) -> torch.Tensor:
    """``[b, V]`` logits as float32 rows, cast and reordered in one kernel (a transposed head gives columns)."""
    return logits.to(torch.float32, memory_format=torch.contiguous_format)


class LayerLoop:
    """One-token decode steps of a ``transformers`` causal LM; build it with :meth:`plan`."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.base = model.model
        self.head = model.lm_head

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
            needs = ((attn, ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling")),
                     (mlp, ("gate_proj", "up_proj", "down_proj", "act_fn")),
                     (layer, ("input_layernorm", "post_attention_layernorm")))
            if not all(hasattr(part, n) for part, names in needs for n in names):
                return None
        return cls(model)

    def covers(self, cache: object, ids: torch.Tensor) -> bool:
        """Whether :meth:`step` can take this call: one new position per row, a BufferLayer per layer, eval mode."""
        layers = getattr(cache, "layers", None)
        return ids.shape[1] == 1 and not self.model.training and layers is not None and \
            len(layers) == len(self.base.layers) and all(type(c) is BufferLayer for c in layers)

    def step(self, ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
             cache: object) -> torch.Tensor:
        """Append one position per row to ``cache``: ids ``[b, 1]``, attention_mask ``[b, L]``, position_ids
        ``[b, 1]`` -> logits ``[b, V]`` float32."""
        b = ids.shape[0]
        h = self.base.embed_tokens(ids)                                   # [b, 1, E]
        cos, sin = self.base.rotary_emb(h, position_ids)                  # [b, 1, D] each
        attend = attention_mask.bool()[:, None, None, :]                  # [b, 1, 1, L]
        for layer, kv in zip(self.base.layers, cache.layers, strict=True):
            attn, mlp = layer.self_attn, layer.mlp
            x = layer.input_layernorm(h)
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
            h = h + mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))
        return float_rows(self.head(self.base.norm(h))[:, -1])
