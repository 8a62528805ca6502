"""A safetensors file written one tensor at a time, so that writing a model for the rollout servers holds at most
one whole tensor in memory besides the model, whatever the model's size.

``safetensors.torch.save_file`` takes every tensor at once: under FSDP that is the whole gathered model in process
0, and for a policy on a GPU a whole CPU copy of it. The file's layout depends only on each tensor's name, shape
and number format, which the model knows before any tensor is read, so the header goes first and each tensor is
read (an FSDP gather), cast, copied to the CPU and written as it comes.

The layout is safetensors' own (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length,
the JSON header (each tensor's ``dtype``, ``shape`` and ``data_offsets`` into the data that follows, padded with
spaces to a multiple of 8 bytes), then the tensors' bytes back to back. Tensors go largest element first so that
each starts at a multiple of its element size (safetensors' own writer orders them so too).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}
"""torch's number formats by their safetensors names."""


@dataclass(frozen=True)
class Entry:
    """One tensor of the file: its name, shape and number format there."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def aligned(entries: Iterable[Entry]) -> list[Entry]:
    """``entries`` in the order the file holds them: largest element first, in their order otherwise, so every
    tensor starts at a multiple of its element size.

    >>> [e.name for e in aligned([Entry("a", (3,), torch.bfloat16), Entry("b", (1,), torch.int64),
    ...                           Entry("c", (2,), torch.bfloat16)])]
    ['b', 'a', 'c']
    """
    return sorted(entries, key=lambda e: -e.dtype.itemsize)


def header(entries: list[Entry], metadata: dict[str, str] | None = None) -> bytes:
    """The file's first bytes for ``entries`` in this order: length, JSON header, padding.

    >>> len(header([Entry("w", (2, 3), torch.float32)])) % 8
    0
    """
    fields: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for e in entries:
        if e.dtype not in DTYPES:
            raise TypeError(f"{e.name}: safetensors holds no {e.dtype}")
        fields[e.name] = {"dtype": DTYPES[e.dtype], "shape": list(e.shape), "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    text = json.dumps(fields, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    return struct.pack("<Q", len(text)) + text


def write_streamed(path: Path, entries: list[Entry], tensors: Iterable[tuple[str, torch.Tensor]],
                   metadata: dict[str, str] | None = None) -> int:
    """Write ``tensors`` ((name, tensor), in ``entries``' order, each of its entry's shape) to ``path``, each cast
    to its entry's number format where it lies (a GPU casts its own) and copied to the CPU only then, one at a
    time. A tensor out of order, of another shape, missing or extra is an error (the file would lie about it).
    Returns the bytes of tensor data written."""
    it = iter(tensors)
    with open(path, "wb") as f:
        f.write(header(entries, metadata))
        for e in entries:
            name, t = _next(it, e, len(entries))  # nothing else holds the previous tensor while this one is read
            if name != e.name or tuple(t.shape) != e.shape:
                raise ValueError(f"the file's layout expects {e.name} of shape {list(e.shape)} here, and came "
                                 f"{name} of shape {list(t.shape)}")
            t = t.detach().to(e.dtype).to("cpu").contiguous()
            f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
            del t
        extra = next(it, None)
        if extra is not None:
            raise ValueError(f"{extra[0]} is not in the file's layout")
    return sum(e.nbytes for e in entries)


def _next(it: Iterator[tuple[str, torch.Tensor]], e: Entry, count: int) -> tuple[str, torch.Tensor]:
    got = next(it, None)
    if got is None:
        raise ValueError(f"the weights ended before {e.name} (the file's layout lists {count})")
    return got
