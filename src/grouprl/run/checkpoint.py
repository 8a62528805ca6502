"""Checkpoints that survive a kill: written to a temporary folder, fsynced, then renamed.

Layout of ``<output_dir>/checkpoints/step-000010/``::

    model/            the policy: safetensors + config (a loadable model folder); with LoRA the adapter only
    reference.safetensors   the reference weights, only when reference sync changed them
    optimizer.pt  scheduler.pt      the optimizer and its schedule (none for a trust-region step)
    critic.safetensors  critic_optimizer.pt   a critic and its optimizer, for algorithms that have one
    rng.pt            python, numpy and torch generator states
    state.json        step, data position, controller states, the config

A checkpoint folder exists under its final name only once every file in it is complete; a
kill during the write leaves a ``.tmp-*`` folder that the next save removes.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from grouprl.models.lora import is_peft

PREFIX = "step-"


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
    """The policy as a model folder: the LoRA adapter alone for a peft model, else config + safetensors
    (a plain ``nn.Module`` without a ``config``, such as a classic-control MLP, gets the safetensors only)."""
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
    """Load weights written by :func:`save_policy` into ``model`` in place (strict)."""
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
    """Complete checkpoints under ``root``, oldest first."""
    if not root.exists():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)),
                  key=lambda p: int(p.name[len(PREFIX):]))


def resolve_checkpoint(spec: str, root: Path) -> Path:
    """``"latest"`` -> the newest checkpoint under ``root``; otherwise the path itself, checked."""
    if spec == "latest":
        found = checkpoint_dirs(root)
        if not found:
            raise FileNotFoundError(f"resume_from='latest' but {root} holds no checkpoint")
        return found[-1]
    path = Path(spec)
    if not (path / "state.json").exists():
        raise FileNotFoundError(f"resume_from={spec!r} is not a checkpoint folder (no state.json in it)")
    return path


def save_checkpoint(root: Path, step: int, *, policy: torch.nn.Module, state: dict[str, Any], tokenizer: Any = None,
                    reference: torch.nn.Module | None = None, stateful: dict[str, Any] | None = None,
                    modules: dict[str, torch.nn.Module] | None = None, keep: int = 2) -> Path:
    """Write checkpoint ``step`` atomically and keep only the newest ``keep``. Returns its folder.

    ``stateful`` objects (optimizers, schedules) are saved as ``<name>.pt`` from their
    ``state_dict()``, ``modules`` (a critic) as ``<name>.safetensors``; all of it is part of the
    atomic write."""
    tmp, final = temporary_folder(root, step, str(os.getpid()))
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


def temporary_folder(root: Path, step: int, tag: str) -> tuple[Path, Path]:
    """(a fresh temporary folder to write checkpoint ``step`` into, its final name); removes the
    temporary folders of saves a kill interrupted."""
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".tmp-{PREFIX}{step:06d}-{tag}"
    tmp.mkdir(parents=True)
    return tmp, root / f"{PREFIX}{step:06d}"


def publish(tmp: Path, final: Path, keep: int) -> Path:
    """Make the fully written ``tmp`` the checkpoint ``final`` (fsynced, then renamed) and keep only
    the newest ``keep`` checkpoints beside it. Returns ``final``."""
    _fsync_tree(tmp)
    if final.exists():  # re-saving the same step (e.g. the final save right after a periodic one)
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in checkpoint_dirs(final.parent)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(folder: Path, *, policy: torch.nn.Module, reference: torch.nn.Module | None = None,
                    stateful: dict[str, Any] | None = None,
                    modules: dict[str, torch.nn.Module] | None = None) -> dict[str, Any]:
    """Restore everything :func:`save_checkpoint` wrote; returns the state dict (with ``step``)."""
    load_policy_weights(policy, folder / "model")
    if reference is not None and (folder / "reference.safetensors").exists():
        load_model(reference, str(folder / "reference.safetensors"))
    for name, obj in (stateful or {}).items():
        obj.load_state_dict(torch.load(folder / f"{name}.pt", weights_only=False))
    for name, module in (modules or {}).items():
        load_model(module, str(folder / f"{name}.safetensors"))
    set_rng_state(torch.load(folder / "rng.pt", weights_only=False))
    return json.loads((folder / "state.json").read_text())
