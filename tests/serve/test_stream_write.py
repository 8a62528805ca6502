"""A weights file written one tensor at a time (grouprl.serve.weights.stream_write) and the reading it is written
from (grouprl.serve.weights.transport.Reading): the file safetensors reads back, in the layout it expects, with one
whole tensor in memory at a time, and a reading every process reads to its end."""

from __future__ import annotations

import gc
import json
import re
import struct
import weakref

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from grouprl.serve.weights.stream_write import Entry, aligned, write_streamed
from grouprl.serve.weights.transport import WEIGHTS_FILE, Reading, write_weights_file

TENSORS = {
    "embed.weight": torch.randn(5, 3),
    "norm.weight": torch.randn(3),
    "position_ids": torch.arange(7).reshape(1, 7),
    "mask": torch.tensor([True, False, True]),
    "scale": torch.tensor(0.5),  # 0-d
    "empty": torch.zeros(0, 4),
}


def entries_of(tensors: dict[str, torch.Tensor], dtype: torch.dtype | None = None) -> list[Entry]:
    return aligned(Entry(n, tuple(t.shape), dtype if dtype is not None and t.is_floating_point() else t.dtype)
                   for n, t in tensors.items())


def layout(path) -> dict:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return {"header_bytes": n, "fields": json.loads(raw[8:8 + n]), "data_bytes": len(raw) - 8 - n}


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_a_streamed_file_reads_back_as_safetensors_and_every_tensor_starts_at_a_multiple_of_its_size(tmp_path, dtype):
    entries = entries_of(TENSORS, dtype)
    path = tmp_path / "w.safetensors"
    written = write_streamed(path, entries, ((e.name, TENSORS[e.name]) for e in entries), {"format": "pt"})
    back = load_file(str(path))
    assert set(back) == set(TENSORS)
    for name, t in TENSORS.items():
        want = t.to(dtype) if dtype is not None and t.is_floating_point() else t
        assert back[name].dtype == want.dtype and torch.equal(back[name], want), name
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}  # what transformers checks before it loads a file
    got = layout(path)
    assert got["header_bytes"] % 8 == 0 and got["data_bytes"] == written
    # 8-byte int64 first, then the floats, then the 1-byte bool: no tensor straddles its own element size
    assert [e.name for e in entries][:1] == ["position_ids"] and entries[-1].name == "mask"
    for e in entries:
        start, end = got["fields"][e.name]["data_offsets"]
        assert start % e.dtype.itemsize == 0 and end - start == e.nbytes, e


def test_each_tensor_is_let_go_before_the_next_is_read(tmp_path):
    """As an FSDP gather makes each whole tensor anew: when the writer asks for the next one, nothing holds the
    ones before it (the file's writer, the renaming on the way, the reading)."""
    names = [f"layer{i}.weight" for i in range(6)]
    alive: list[weakref.ref] = []
    held_at_each_read = []

    def gathered():
        for name in names:
            gc.collect()
            held_at_each_read.append(sum(r() is not None for r in alive))
            t = torch.full((64, 64), float(len(alive)))
            alive.append(weakref.ref(t))
            yield name, t
            del t

    entries = [Entry(n, (64, 64), torch.float32) for n in names]
    write_weights_file(object(), Reading(entries, gathered()), tmp_path)
    assert held_at_each_read == [0] * len(names)
    back = load_file(str(tmp_path / WEIGHTS_FILE))
    assert [float(back[n][0, 0]) for n in names] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_a_tensor_other_than_the_layout_says_is_an_error_naming_it(tmp_path):
    entries = [Entry("a", (2,), torch.float32), Entry("b", (3,), torch.float32)]
    a, b = torch.zeros(2), torch.zeros(3)
    cases = {"came b of shape [3]": [("b", b), ("a", a)],
             "expects b of shape [3] here, and came b of shape [2]": [("a", a), ("b", a)],
             "ended before b": [("a", a)],
             "c is not in the file's layout": [("a", a), ("b", b), ("c", a)]}
    for message, given in cases.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            write_streamed(tmp_path / "w.safetensors", entries, iter(given))


def test_a_format_safetensors_lacks_is_named():
    from grouprl.serve.weights.stream_write import header

    with pytest.raises(TypeError, match="w: safetensors holds no torch.complex64"):
        header([Entry("w", (2,), torch.complex64)])


def counted(n: int, fail_at: int | None = None):
    """A reading of ``n`` tensors that counts how many were read (each read would be a gather every process makes)."""
    reads = []

    def tensors():
        for i in range(n):
            reads.append(i)
            yield f"t{i}", torch.zeros(2)

    return Reading([Entry(f"t{i}", (2,), torch.float32) for i in range(n)], tensors()), reads


def test_a_reading_is_read_to_its_end_after_an_error_midway_but_not_after_an_interrupt():
    read, reads = counted(5)
    with pytest.raises(OSError, match="disk full"), read.through():
        next(read.tensors)
        raise OSError("disk full")
    assert reads == [0, 1, 2, 3, 4]  # the other processes' gathers of 1..4 are met
    read, reads = counted(5)
    with pytest.raises(KeyboardInterrupt), read.through():
        next(read.tensors)
        raise KeyboardInterrupt
    assert reads == [0]  # the run is going: nobody waits for the rest
