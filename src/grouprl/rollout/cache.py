"""A KV cache written in place that can drop or repeat rows cheaply: ``transformers``' ``DynamicLayer`` grows by
``torch.cat``, copying the whole cache every token. Only full-attention layers are replaced."""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class BufferLayer(DynamicLayer):
    """One layer's keys and values in a preallocated ``[b, heads, capacity, head_dim]`` buffer, doubled when
    outrun; ``keys`` / ``values`` are views ``[b, heads, n, head_dim]`` of the ``n`` filled positions."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self._kbuf: torch.Tensor | None = None
        self._vbuf: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._kbuf = key_states.new_empty(*key_states.shape[:2], self.capacity, key_states.shape[-1])
        self._vbuf = value_states.new_empty(*value_states.shape[:2], self.capacity, value_states.shape[-1])

    def _expose(self) -> None:
        self.keys = self._kbuf[:, :, : self.length]
        self.values = self._vbuf[:, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append ``[b, heads, q, head_dim]`` new states; returns the filled views."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        q = key_states.shape[-2]
        if self.length + q > self.capacity:
            self._grow(self.length + q)
        self._kbuf[:, :, self.length : self.length + q] = key_states
        self._vbuf[:, :, self.length : self.length + q] = value_states
        self.length += q
        self._expose()
        return self.keys, self.values

    @property
    def buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole key and value buffers, ``[b, heads, capacity, head_dim]`` each (after the first update)."""
        return self._kbuf, self._vbuf

    def advance(self, q: int) -> None:
        """Count ``q`` positions that were written into the buffers directly (a compiled step's) as filled."""
        self.length += q
        self._expose()

    def _grow(self, needed: int) -> None:
        self.capacity = max(needed, 2 * self.capacity)
        for name in ("_kbuf", "_vbuf"):
            old = getattr(self, name)
            new = old.new_empty(*old.shape[:2], self.capacity, old.shape[-1])
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)

    def get_seq_length(self) -> int:
        return self.length

    def _rebuild(self, rows: torch.Tensor) -> None:
        # a fresh buffer of the kept rows: the attention reads no dead rows
        if not self.is_initialized:
            return
        n = self.length
        k = self._kbuf.new_empty(rows.numel(), *self._kbuf.shape[1:])
        v = self._vbuf.new_empty(rows.numel(), *self._vbuf.shape[1:])
        k[:, :, :n] = self._kbuf[:, :, :n].index_select(0, rows)
        v[:, :, :n] = self._vbuf[:, :, :n].index_select(0, rows)
        self._kbuf, self._vbuf = k, v
        self._expose()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._rebuild(indices.to(self._kbuf.device) if self._kbuf is not None else indices)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self._kbuf is None:
            return
        rows = torch.arange(self._kbuf.shape[0], device=self._kbuf.device).repeat_interleave(repeats)
        self._rebuild(rows)

    def reset(self) -> None:
        super().reset()
        self.length = 0
        self._kbuf = self._vbuf = None

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of positions to remove")
        self.length = max(0, self.length + tokens_to_remove)
        if self.is_initialized:
            self._expose()


def make_cache(model: torch.nn.Module, capacity: int) -> DynamicCache:
    """A ``DynamicCache`` for ``model`` whose full-attention layers hold ``capacity`` positions in place."""
    config = getattr(model, "config", None)
    cache = DynamicCache(config=config) if config is not None else DynamicCache()
    if cache.layers:
        cache.layers = [BufferLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
