"""Reading back what wandb wrote offline, with wandb's own record schema."""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32 * 1024
HEADER = struct.Struct("<IHB")  # CRC32, length, chunk type (1 full, 2 first, 3 middle, 4 last)
FILE_HEADER = struct.Struct("<4sHB")  # b":W&B", magic 0xBEE1, version


def records(path: Path) -> list:
    """The protobuf Records of one ``run-<id>.wandb`` file: a LevelDB-style log of 32 KiB blocks, each
    record cut into chunks behind a 7-byte header; a block's last bytes too short for a header are padding."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, _ = FILE_HEADER.unpack_from(data)
    assert (ident, magic) == (b":W&B", 0xBEE1), f"{path} is not a wandb transaction log"
    out, pending, pos = [], b"", FILE_HEADER.size
    while pos + HEADER.size <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER.size:
            pos += left
            continue
        _, length, kind = HEADER.unpack_from(data, pos)
        if kind == 0 and length == 0:  # zero padding to the block's end
            pos += left
            continue
        pending += data[pos + HEADER.size:pos + HEADER.size + length]
        pos += HEADER.size + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def history(folder: Path) -> dict[int, dict[str, float]]:
    """Every metric logged to the wandb runs under ``folder`` (a run folder's ``wandb/``), by step;
    wandb's own keys (``_step``, ``_runtime``...) left out."""
    by_step: dict[int, dict[str, float]] = {}
    for path in sorted(folder.glob("*run-*/run-*.wandb")):
        for record in records(path):
            if record.WhichOneof("record_type") != "history":
                continue
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            step = int(items["_step"])
            by_step.setdefault(step, {}).update({k: v for k, v in items.items() if not k.startswith("_")})
    return by_step
