"""Attention for decode steps: each row's few new queries against its cached keys by head group, with no copy of
the cache (``transformers``' SDPA path copies it through ``repeat_kv`` when a mask is passed on a CPU). CPU bf16
uses fused SDPA with ``enable_gqa``; fp32 and GPUs two batched products around a softmax. Prefills keep SDPA.

Shapes: B rows, H query heads in KV groups of g = H / KV, q new positions, L cached + new positions, D head width."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

NAME = "grouprl_decode"
MAX_QUERIES = 16  # new positions per row up to which a call is a decode step; longer ones go to SDPA


def grouped_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                      scaling: float) -> torch.Tensor:
    """softmax(q k^T * scaling + mask) v by head group: query ``[B, H, q, D]``, key and value ``[B, KV, L, D]``,
    mask ``[B, 1, q, L]`` bool or additive (None: causal) -> ``[B, q, H, D]``; an empty row gives no NaNs."""
    q, length = query.shape[2], key.shape[2]
    if mask is None and q > 1:
        positions = torch.arange(length, device=query.device)
        mask = (positions <= positions[length - q:, None]).view(1, 1, q, length)  # each query sees up to itself
    # measured on CPUs only: a GPU keeps the products it was checked with
    attend = _fused if query.device.type == "cpu" and query.dtype != torch.float32 else _products
    return attend(query, key, value, mask, scaling)


def _fused(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
           scaling: float) -> torch.Tensor:
    """:func:`grouped_attention` through PyTorch's SDPA on the grouped heads (a query attending nothing: zeros)."""
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(query.dtype).clamp(min=torch.finfo(query.dtype).min)  # -inf rows would give NaNs
    # the fused kernel needs unit-stride heads, else SDPA's unfused path rounds differently
    query, key, value = (t if t.stride(-1) == 1 else t.contiguous() for t in (query, key, value))
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous()                                                 # [B, q, H, D]


def _products(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
              scaling: float) -> torch.Tensor:
    """:func:`grouped_attention` as two batched products around a float32 softmax (a query attending nothing:
    the mean of the values, as in ``transformers``' eager attention)."""
    b, h, q, d = query.shape
    kv, length = key.shape[1], key.shape[2]
    g = h // kv
    scores = torch.matmul(query.reshape(b, kv, g * q, d), key.transpose(-1, -2)) * scaling  # [B, KV, g*q, L]
    scores = scores.float().view(b, kv, g, q, length)                                      # shape [B, KV, g, q, L]
    if mask is not None:
        mask = mask.unsqueeze(1)                                                               # [B, 1, 1, q, L]
        # the lowest float, not -inf: a query with nothing to attend to gets finite weights
        low = torch.finfo(torch.float32).min
        scores = scores.masked_fill(~mask, low) if mask.dtype == torch.bool else (scores + mask.float()).clamp(min=low)
    probs = torch.softmax(scores, dim=-1).to(value.dtype).view(b, kv, g * q, length)
    out = torch.matmul(probs, value).view(b, kv, g, q, d).reshape(b, h, q, d)              # [B, H, q, D]
    return out.transpose(1, 2).contiguous()                                                 # [B, q, H, D]


def _attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
               **kwargs: Any) -> tuple[torch.Tensor, None]:
    """:func:`grouped_attention` for decode steps; SDPA otherwise and for dropout, soft-capping and sinks."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    special = dropout or kwargs.get("softcap") or kwargs.get("s_aux") is not None or \
        getattr(module, "sinks", None) is not None
    if query.shape[2] > MAX_QUERIES or special or query.shape[1] % key.shape[1]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return grouped_attention(query, key, value, attention_mask, scale), None


def register() -> None:
    """Make :data:`NAME` known to ``transformers`` (its masks are SDPA's: bool, or None when causal)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, _attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)


def sdpa_configs(model: nn.Module) -> list[Any]:
    """The distinct configs of ``model`` and its submodules whose attention is SDPA."""
    found = {id(m.config): m.config for m in model.modules()
             if getattr(getattr(m, "config", None), "_attn_implementation", None) == "sdpa"}
    return list(found.values())


@contextlib.contextmanager
def decoding(configs: list[Any]) -> Iterator[None]:
    """Within the block, models of ``configs`` (:func:`sdpa_configs`) decode with :func:`_attention`."""
    if not configs:
        yield
        return
    register()
    for c in configs:  # the stored field, not the property: the property also rewrites sub-configs
        c._attn_implementation_internal = NAME
    try:
        yield
    finally:
        for c in configs:
            c._attn_implementation_internal = "sdpa"
