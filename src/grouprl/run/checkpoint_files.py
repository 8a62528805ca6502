"""Checkpoints that survive a kill: written to a temporary folder, fsynced, then renamed.

Layout of ``<output_dir>/checkpoints/step-000010/``::

    model/            the policy: safetensors + config (a loadable model folder); with LoRA the adapter only
    reference.safetensors   the reference weights, only when reference sync changed them
    optimizer.pt  scheduler.pt      the optimizer and its schedule (none for a trust-region step)
    critic.safetensors  critic_optimizer.pt   a critic and its optimizer, for algorithms that have one
    rng.pt            python, numpy and torch generator states
    state.json        step, data position, controller states, the config
    manifest.json     every other file's size and SHA-256, written last

A folder gets its ``step-*`` name only once whole; old ones are renamed ``.delete-*`` before removal
(docs/guarantees.md)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import random
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from grouprl.errors import CheckpointError
from grouprl.models.lora import is_peft

PREFIX = "step-"
MANIFEST = "manifest.json"


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_policy(model: torch.nn.Module, folder: Path, tokenizer: Any = None) -> None:
    """The policy as a model folder: the LoRA adapter alone for a peft model, else config (if any) + safetensors."""
    folder.mkdir(parents=True, exist_ok=True)
    if is_peft(model):
        model.save_pretrained(str(folder))
    else:
        if getattr(model, "config", None) is not None:
            model.config.save_pretrained(str(folder))
        # save_model deduplicates tied tensors (embeddings / LM head) that save_file refuses.
        save_model(model, str(folder / "model.safetensors"))
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(str(folder))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))


def load_policy_weights(model: torch.nn.Module, folder: Path) -> None:
    if is_peft(model):
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        result = set_peft_model_state_dict(model, load_file(str(folder / "adapter_model.safetensors")))
        if getattr(result, "unexpected_keys", None):
            raise ValueError(f"checkpoint adapter has unexpected keys: {result.unexpected_keys[:5]}")
    else:
        missing, unexpected = load_model(model, str(folder / "model.safetensors"), strict=True)
        if missing or unexpected:
            raise ValueError(f"checkpoint does not match the model: missing {missing}, unexpected {unexpected}")


def checkpoint_dirs(root: Path) -> list[Path]:
    """Checkpoint folders under ``root`` (complete or not: see :func:`is_complete`), oldest first."""
    if not root.exists():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)),
                  key=lambda p: int(p.name[len(PREFIX):]))


def latest_complete(root: Path, warn: Any = None) -> Path | None:
    """The newest complete checkpoint under ``root`` or None; ``warn`` hears of each newer incomplete one."""
    found = checkpoint_dirs(root)
    for folder in reversed(found):
        if is_complete(folder):
            return folder
        if warn is not None:
            warn(f"skipping {folder}: it is incomplete (no manifest, or a file of the wrong size)")
    return None


def resolve_checkpoint(spec: str, root: Path) -> Path:
    """``"latest"`` -> the newest complete checkpoint under ``root``; otherwise the path itself, checked."""
    if spec == "latest":
        found = latest_complete(root, lambda message: warnings.warn(message, stacklevel=2))
        if found is None:
            raise FileNotFoundError(f"resume_from='latest' but {root} holds no complete checkpoint")
        return found
    path = Path(spec)
    if not (path / "state.json").exists():
        raise FileNotFoundError(f"resume_from={spec!r} is not a checkpoint folder (no state.json in it)")
    return path


def save_checkpoint(root: Path, step: int, *, policy: torch.nn.Module, state: dict[str, Any], tokenizer: Any = None,
                    reference: torch.nn.Module | None = None, stateful: dict[str, Any] | None = None,
                    modules: dict[str, torch.nn.Module] | None = None, keep: int = 2) -> Path:
    """Write checkpoint ``step`` atomically (``stateful`` as ``<name>.pt``, ``modules`` as ``<name>.safetensors``)
    and keep only the newest ``keep``; returns its folder."""
    tmp, final = temporary_folder(root, step, str(os.getpid()))
    with writing(tmp, step, _state_bytes(policy, reference, stateful, modules)):
        save_policy(policy, tmp / "model", tokenizer)
        if reference is not None:
            save_model(reference, str(tmp / "reference.safetensors"))
        for name, obj in (stateful or {}).items():
            torch.save(obj.state_dict(), tmp / f"{name}.pt")
        for name, module in (modules or {}).items():
            save_model(module, str(tmp / f"{name}.safetensors"))
        torch.save(rng_state(), tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=2, default=str))
        return publish(tmp, final, keep)


def _tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def _state_bytes(policy: torch.nn.Module, reference: torch.nn.Module | None, stateful: dict[str, Any] | None,
                 modules: dict[str, torch.nn.Module] | None) -> int:
    """About what a checkpoint of these takes on disk."""
    parts = [policy.state_dict(), *(m.state_dict() for m in [reference, *(modules or {}).values()] if m is not None),
             *(obj.state_dict() for obj in (stateful or {}).values())]
    return sum(_tensor_bytes(p) for p in parts)


def _is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` or its cause is the file system's "no space" or "quota" error."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        error = error.__cause__ or error.__context__
    return False


@contextlib.contextmanager
def writing(tmp: Path, step: int, needed: int) -> Iterator[None]:
    """Around writing checkpoint ``step`` into ``tmp``: a failure removes ``tmp``, and a full disk is a
    :class:`CheckpointError` saying so. A short write without ``ENOSPC`` (torch's zip writer) counts as a full
    disk when less than ``needed`` bytes are free."""
    try:
        yield
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        free = shutil.disk_usage(tmp.parent).free
        if not (_is_disk_full(e) or isinstance(e, OSError | RuntimeError) and free < needed):
            raise
        kept = [d.name for d in checkpoint_dirs(tmp.parent) if is_complete(d)]
        raise CheckpointError(
            f"the disk holding {tmp.parent} is full: checkpoint step {step} needs about {_size(needed)} and "
            f"{_size(free)} is free ({type(e).__name__}: {str(e)[:200]}). The partial checkpoint was removed; "
            + (f"the previous one, {tmp.parent / kept[-1]}, is kept. " if kept else "")
            + "Free space (or lower keep_checkpoints), then resume with --resume_from latest") from e


def _size(n: int) -> str:
    """``n`` bytes, readable.

    >>> _size(1000), _size(49_928), _size(3 * 2**30)
    ('1000 B', '48.8 KiB', '3.0 GiB')
    """
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def temporary_folder(root: Path, step: int, tag: str) -> tuple[Path, Path]:
    """(a fresh temporary folder for checkpoint ``step``, its final name); removes what a kill left behind."""
    root.mkdir(parents=True, exist_ok=True)
    for stale in [*root.glob(".tmp-*"), *root.glob(".delete-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".tmp-{PREFIX}{step:06d}-{tag}"
    tmp.mkdir(parents=True)
    return tmp, root / f"{PREFIX}{step:06d}"


def publish(tmp: Path, final: Path, keep: int) -> Path:
    """Make ``tmp`` the checkpoint ``final`` (manifest, fsync, rename) and keep only the newest ``keep``."""
    if is_complete(final):
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        write_manifest(tmp)
        _fsync_tree(tmp)
        if final.exists():  # an incomplete leftover under the final name (from an older version)
            retire(final)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
    for old in checkpoint_dirs(final.parent)[:-keep] if keep > 0 else []:
        retire(old)
    return final


def retire(folder: Path) -> None:
    gone = folder.with_name(f".delete-{folder.name}-{os.getpid()}")
    os.replace(folder, gone)
    shutil.rmtree(gone, ignore_errors=True)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(folder: Path) -> None:
    """``folder/manifest.json``: every file's relative path, size and SHA-256."""
    files = {str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": _digest(p)}
             for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST}
    (folder / MANIFEST).write_text(json.dumps(files, indent=1))


def _manifest(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_complete(folder: Path) -> bool:
    """Whether ``folder`` has a manifest and every file it lists at its size (or is a readable pre-manifest one)."""
    files = _manifest(folder)
    if files is None:
        return not (folder / MANIFEST).exists() and _legacy(folder)
    try:
        return all((folder / name).stat().st_size == entry["size"] for name, entry in files.items())
    except (OSError, KeyError, TypeError):
        return False


def _legacy(folder: Path) -> bool:
    try:
        json.loads((folder / "state.json").read_text())
    except (OSError, ValueError):
        return False
    return (folder / "model").is_dir()


def verify_checkpoint(folder: Path) -> None:
    """A :class:`CheckpointError` naming the first file that fails its digest and the checkpoint to fall back on."""
    if not (folder / MANIFEST).exists() and _legacy(folder):
        warnings.warn(f"{folder} was written before checkpoints carried a manifest: its files are not verified",
                      stacklevel=2)
        return
    files = _manifest(folder)
    problem = None if files is not None else f"{folder / MANIFEST} is missing or unreadable"
    for name, entry in (files or {}).items():
        path = folder / name
        if not path.is_file():
            problem = f"{path} is missing"
        elif path.stat().st_size != entry.get("size") or _digest(path) != entry.get("sha256"):
            problem = f"{path} is damaged (its size or SHA-256 differs from the manifest's)"
        if problem:
            break
    if problem is None:
        return
    earlier = [d for d in checkpoint_dirs(folder.parent) if d.name < folder.name and is_complete(d)]
    offer = (f"; the checkpoint before it, {earlier[-1]}, is intact: pass it to --resume_from (or to --model to "
             "evaluate it)") if earlier else ""
    raise CheckpointError(f"checkpoint {folder} cannot be used: {problem}{offer}")


def load_checkpoint(folder: Path, *, policy: torch.nn.Module, reference: torch.nn.Module | None = None,
                    stateful: dict[str, Any] | None = None,
                    modules: dict[str, torch.nn.Module] | None = None) -> dict[str, Any]:
    """Restore everything :func:`save_checkpoint` wrote, once verified; returns its state (with ``step``)."""
    state_file = folder / "state.json"
    world = json.loads(state_file.read_text()).get("world_size") if state_file.exists() else None
    if world is not None:  # sharded state: a process group wrote it (several processes, or one on a GPU)
        how = "one process on a GPU" if world == 1 else f"--nproc {world}"
        raise ValueError(f"{folder} was written by a run with a process group ({how}): resume it the same way, or "
                         f"start from its weights with --model {folder / 'model'}")
    verify_checkpoint(folder)
    load_policy_weights(policy, folder / "model")
    if reference is not None and (folder / "reference.safetensors").exists():
        load_model(reference, str(folder / "reference.safetensors"))
    for name, obj in (stateful or {}).items():
        obj.load_state_dict(torch.load(folder / f"{name}.pt", weights_only=False))
    for name, module in (modules or {}).items():
        load_model(module, str(folder / f"{name}.safetensors"))
    set_rng_state(torch.load(folder / "rng.pt", weights_only=False))
    return json.loads((folder / "state.json").read_text())
