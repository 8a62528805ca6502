"""Loading a policy and its tokenizer by bundled name, folder, ``.gguf`` file or Hugging Face id."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from grouprl.errors import ModelLoadError
from grouprl.models.bundled import BUNDLED, bundled_model_folder, cache_root, convert_gguf
from grouprl.models.lora import LoraSettings, apply_lora


def resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """``torch.float32`` or its name (``"float32"``, ``"bf16"`` ...) -> a torch dtype.

    >>> resolve_dtype("bf16")
    torch.bfloat16
    """
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    aliases = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "half": "float16", "float": "float32"}
    name = aliases.get(str(dtype), str(dtype))
    found = getattr(torch, name, None)
    if not isinstance(found, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16")
    return found


def ensure_pad_token(tokenizer: Any, model: torch.nn.Module | None = None) -> None:
    """Give ``tokenizer`` a pad token if it has none (EOS, else UNK, else a new ``<|pad|>`` with the embeddings
    resized; padding is always masked, so EOS is harmless), warning when it had to; mirror it into the config."""
    if tokenizer.pad_token is None:
        fallback = tokenizer.eos_token or getattr(tokenizer, "unk_token", None)
        if fallback is not None:
            tokenizer.pad_token = fallback
            warnings.warn(f"the tokenizer has no pad token; using {fallback!r} for padding", stacklevel=3)
        else:
            tokenizer.add_special_tokens({"pad_token": "<|pad|>"})
            warnings.warn("the tokenizer has no pad, EOS or UNK token; added '<|pad|>'", stacklevel=3)
            if model is not None:
                model.resize_token_embeddings(len(tokenizer))
    if model is not None:
        model.config.pad_token_id = tokenizer.pad_token_id
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.pad_token_id = tokenizer.pad_token_id


def _locate(spec: str) -> Path | str:
    """A bundled model's cache folder, a local model folder or file, a cached hub id's folder, or the id when the
    hub can be reached; what cannot load fails here at once, not after retries."""
    if spec in BUNDLED:
        return bundled_model_folder(spec)
    local = Path(spec).expanduser()
    bundled = ", ".join(BUNDLED.names())
    if local.exists():
        if local.is_dir() and not (local / "config.json").is_file():
            raise ModelLoadError(f"{spec!r} is a folder with no model in it (no config.json); pass a model folder, "
                                 f"a run or checkpoint folder, a .gguf file or a bundled model ({bundled})")
        return local
    if spec.startswith(("/", ".", "~")) or spec.endswith(".gguf"):
        raise ModelLoadError(f"model path {spec!r} does not exist (bundled models: {bundled})")
    cached = _hub_cache_folder(spec)
    if cached is not None:
        return cached
    unreachable = _hub_unreachable()
    if unreachable:
        raise ModelLoadError(f"model {spec!r} is not a local path, not a bundled model ({bundled}) and not in the "
                             f"local Hugging Face cache, and the hub cannot be reached to download it "
                             f"({unreachable})")
    return spec


def _hub_cache_folder(repo_id: str) -> Path | None:
    """The cached snapshot folder of ``repo_id`` (one holding its config.json), or None."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except ValueError:  # not a valid repo id at all
        return None
    return Path(found).parent if isinstance(found, str) else None


HUB_PROBE_SECONDS = 3.0  # before the hub counts as unreachable


def _hub_unreachable() -> str | None:
    """Why the Hugging Face hub cannot be reached (offline mode, no route, no name), or None."""
    import urllib.error
    import urllib.request

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    try:
        urllib.request.urlopen(constants.ENDPOINT, timeout=HUB_PROBE_SECONDS).close()
    except urllib.error.HTTPError:
        return None  # it answered
    except (urllib.error.URLError, OSError) as e:
        return f"{constants.ENDPOINT}: {getattr(e, 'reason', e)}"
    return None


def _load_pretrained(where: Path | str, dtype: torch.dtype | None) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if isinstance(where, Path) and where.suffix == ".gguf":
        where = convert_gguf(where, cache_root() / f"gguf-{where.stem.lower()}-{where.stat().st_size}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(where)
        model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype)
    except OSError as e:
        raise ModelLoadError(
            f"could not load model {str(where)!r}: it is neither a local folder with a model and tokenizer nor "
            f"a Hugging Face id available offline (bundled models: {', '.join(BUNDLED.names())}). Cause: {e}"
        ) from e
    return model, tokenizer


def load_policy(spec: str = "smollm2-135m", dtype: torch.dtype | str | None = torch.float32,
                lora: LoraSettings | None = None) -> tuple[torch.nn.Module, Any]:
    """(model in eval mode, tokenizer with a pad token) for ``spec``; with ``lora`` a peft model whose adapters
    alone train."""
    dtype = resolve_dtype(dtype)  # a bad name fails before any file is touched
    model, tokenizer = _load_pretrained(_locate(spec), dtype)
    ensure_pad_token(tokenizer, model)
    if lora is not None:
        model = apply_lora(model, lora)
    return model, tokenizer


def context_length(model: torch.nn.Module) -> int | None:
    """The longest sequence (prompt + completion tokens) the model was built for, if it says so."""
    config = getattr(model, "config", None)
    return getattr(config, "max_position_embeddings", None)
