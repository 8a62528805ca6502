"""A safetensors file written one tensor at a time, so a push holds at most one whole tensor besides the model
(``safetensors.torch.save_file`` takes them all at once); the header goes first, the largest elements first."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}


@dataclass(frozen=True)
class Entry:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def aligned(entries: Iterable[Entry]) -> list[Entry]:
    """``entries`` in the file's order: largest element first, stable otherwise.

    >>> [e.name for e in aligned([Entry("a", (3,), torch.bfloat16), Entry("b", (1,), torch.int64),
    ...                           Entry("c", (2,), torch.bfloat16)])]
    ['b', 'a', 'c']
    """
    return sorted(entries, key=lambda e: -e.dtype.itemsize)


def header(entries: list[Entry], metadata: dict[str, str] | None = None) -> bytes:
    """The file's first bytes for ``entries`` in this order: length, JSON header, padding to 8 bytes."""
    fields: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for e in entries:
        if e.dtype not in DTYPES:
            raise TypeError(f"{e.name}: safetensors holds no {e.dtype}")
        fields[e.name] = {"dtype": DTYPES[e.dtype], "shape": list(e.shape), "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    text = json.dumps(fields, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def write_streamed(path: Path, entries: list[Entry], tensors: Iterable[tuple[str, torch.Tensor]],
                   metadata: dict[str, str] | None = None) -> int:
    """Write ``tensors`` ((name, tensor) in ``entries``' order) to ``path``, each cast where it lies, then copied to
    the CPU; one out of order, of another shape, missing or extra is an error. Returns the data bytes written."""
    it = iter(tensors)
    with open(path, "wb") as f:
        f.write(header(entries, metadata))
        for e in entries:
            got = next(it, None)  # nothing else holds the previous tensor while this one is read
            if got is None:
                raise ValueError(f"the weights ended before {e.name} (the file's layout lists {len(entries)})")
            name, t = got
            if name != e.name or tuple(t.shape) != e.shape:
                raise ValueError(f"the file's layout expects {e.name} of shape {list(e.shape)} here, and came "
                                 f"{name} of shape {list(t.shape)}")
            t = t.detach().to(e.dtype).to("cpu").contiguous()
            f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
            del got, t
        if (extra := next(it, None)) is not None:
            raise ValueError(f"{extra[0]} is not in the file's layout")
    return sum(e.nbytes for e in entries)
