"""Writing a run's files so that a kill never leaves a torn one, and configs as plain data."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` through a fsynced temporary file renamed over ``path``: never half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; these are ordinary files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def as_plain(value: Any) -> Any:
    """Nested dataclasses, mappings and sequences as plain YAML/JSON data (fields marked
    ``metadata={"secret": True}`` left out).

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class C:
    ...     sizes: tuple = (64, 64)
    >>> as_plain({"run": C()})
    {'run': {'sizes': [64, 64]}}
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: as_plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.init and not f.metadata.get("secret")}  # a credential is never written down
    if isinstance(value, list | tuple):
        return [as_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: as_plain(v) for k, v in value.items()}
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value
