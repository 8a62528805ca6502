"""What the installed vLLM can serve, asked once per install and kept in ``$XDG_CACHE_HOME/grouprl/vllm-facts.json``
(keyed by vLLM's files' paths and times); a cache that cannot be read or written is no error."""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

FILE = "vllm-facts.json"
SOURCES = ("__init__.py", "model_executor/models/registry.py", "v1/attention/backends/cpu_attn.py")


def cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "grouprl" / FILE


def installed_key() -> str | None:
    """The installed vLLM as its files' paths and modification times; None without vLLM."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return None
    root = Path(spec.origin).parent
    stamps = []
    for name in SOURCES:
        try:
            stamps.append(f"{root / name}@{(root / name).stat().st_mtime_ns}")
        except OSError:
            stamps.append(f"{root / name}@missing")
    return ";".join(stamps)


def _read(path: Path, key: str) -> dict[str, Any]:
    try:
        held = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return held.get("facts", {}) if isinstance(held, dict) and held.get("key") == key else {}


def _write(path: Path, key: str, facts: dict[str, Any]) -> None:
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"key": key, "facts": facts}, f)
        os.replace(tmp, path)  # two runs starting at once each leave whole facts
    except OSError:  # a read-only home: asked again next time
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def fact(name: str, ask: Callable[[], Any]) -> Any:
    """The installed vLLM's fact ``name`` (JSON data), from the cache, else ``ask()``, kept."""
    key = installed_key()
    if key is None:
        return ask()
    path = cache_file()
    facts = _read(path, key)
    if name not in facts:
        facts = {**facts, name: ask()}
        _write(path, key, facts)
    return facts[name]
