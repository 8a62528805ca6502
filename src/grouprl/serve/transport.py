"""How weights travel from the trainer to rollout servers: safetensors files in a folder both sides see
(same machine: /dev/shm or a folder under the run; several machines: a shared mount), one folder per
policy version, written under a temporary name and renamed whole, so a server never reads half a file.

A full push is the model's state dict in the servers' number format (``model.safetensors``, a tied
output head included under its own name); a LoRA push is the adapter alone
(``adapter_model.safetensors`` and ``adapter_config.json``, peft's layout, which vLLM loads as a LoRA
request). The server reloads a full push in place (vLLM's ``reload_weights`` from a path).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

WEIGHTS_FILE = "model.safetensors"


def default_weights_root() -> Path:
    """Where pushes go when nobody said: /dev/shm (memory, no disk writes) when it exists, else the
    system's temporary folder."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def unshared_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """``named`` with a copy of each tensor that shares storage with one taken before it: safetensors refuses
    shared storage, and a tied output head must still arrive under its own name (vLLM 0.32's CPU build
    keeps its own head matrix and reloads it only from ``lm_head.weight``; without it the head keeps its old
    values, which a test caught as greedy completions that no longer matched)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, int]] = set()
    for name, t in named:
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        out[name] = t.clone() if key in seen and t.numel() else t
        seen.add(key)
    return out


def write_safetensors(named: Iterable[tuple[str, torch.Tensor]], folder: Path, dtype: torch.dtype | None) -> int:
    """Write ``named`` to ``folder/model.safetensors``, floating tensors cast to ``dtype`` (None: as they
    are); returns the bytes written."""
    from safetensors.torch import save_file

    tensors = {n: (t.to(dtype) if dtype is not None and t.is_floating_point() else t).detach().to("cpu").contiguous()
               for n, t in unshared_tensors(named).items()}
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / WEIGHTS_FILE))
    return sum(t.numel() * t.element_size() for t in tensors.values())


def plain_tensors(model: Any) -> Iterable[tuple[str, torch.Tensor]]:
    """``model``'s weights under the plain model's names: a peft LoRA model's base weights (adapters left
    out), anything else's state dict."""
    from grouprl.rollout.vllm_weights import base_weight_name

    if not hasattr(model, "peft_config"):
        return model.state_dict().items()
    return ((base_weight_name(n), t) for n, t in model.state_dict().items() if base_weight_name(n) is not None)


def write_model_folder(model: Any, tokenizer: Any, folder: Path, dtype: torch.dtype | None) -> None:
    """A model folder that ``transformers`` and vLLM both load: config (with the ``transformers`` class as
    its architecture), tokenizer and weights (a LoRA model's base), floating weights in ``dtype``."""
    from grouprl.rollout.engines import plain_class_name

    inner = model.get_base_model() if hasattr(model, "peft_config") else model
    config = inner.config.__class__.from_dict(inner.config.to_dict())
    config.architectures = [plain_class_name(inner)]
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_safetensors(plain_tensors(model), folder, dtype)


class WeightFolders:
    """Versioned push folders under ``root`` (``v<version>``), each complete once it has its name."""

    def __init__(self, root: str | Path | None = None):
        base = Path(root) if root is not None else default_weights_root()
        base.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix="grouprl-weights-", dir=base))

    def path(self, version: int, adapter: bool = False) -> Path:
        """``v<version>`` (full weights) or ``v<version>-lora`` (an adapter) under :attr:`root`."""
        return self.root / (f"v{version}-lora" if adapter else f"v{version}")

    def write_full(self, named: Iterable[tuple[str, torch.Tensor]], version: int, dtype: torch.dtype | None) -> Path:
        """The whole model as version ``version``; returns its folder."""
        return self._publish(self.path(version), lambda tmp: write_safetensors(named, tmp, dtype))

    def write_adapter(self, model: Any, state: dict[str, torch.Tensor], version: int) -> Path:
        """A peft model's adapter weights ``state`` (its ``.lora_`` entries) as version ``version``."""
        return self._publish(self.path(version, adapter=True), lambda tmp: model.save_pretrained(str(tmp),
                                                                                                   state_dict=state))

    def _publish(self, path: Path, write: Any) -> Path:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=self.root))
        try:
            write(tmp)
            os.replace(tmp, path)  # a server sees the folder whole or not at all
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return path

    def keep_only(self, version: int) -> None:
        """Remove every version but ``version`` (each server has loaded it)."""
        keep = {self.path(version).name, self.path(version, adapter=True).name}
        for entry in self.root.iterdir():
            if entry.name not in keep:
                shutil.rmtree(entry, ignore_errors=True)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
