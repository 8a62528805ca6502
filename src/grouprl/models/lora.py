"""LoRA (Hu et al. 2021): adapters trained instead of the full weights, merged back into a plain model for release."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class LoraSettings:
    """Adapter settings: the update is (alpha / rank) * B A; dropout 0 keeps the log-probs deterministic, as the
    importance ratio assumes; ``target_modules`` "all-linear" is every linear layer but the output head."""

    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] | str = "all-linear"

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


def is_peft(model: torch.nn.Module) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # peft is a dependency, but a reference copy must not need it
        return False
    return isinstance(unwrap_ddp(model), PeftModel)


def unwrap_ddp(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def store_frozen_linears(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """Store the frozen weights of ``model``'s linear layers (a LoRA base) in ``dtype``; returns how many. Tied
    weights and biases keep their format, copied out of any memory-mapped file so its pages are let go."""
    shared = {id(p) for m in model.modules() if not isinstance(m, torch.nn.Linear) for p in m.parameters(recurse=False)}
    converted = set()
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if (isinstance(module, torch.nn.Linear) and not weight.requires_grad and id(weight) not in shared
                and weight.dtype != dtype):
            weight.data = weight.data.to(dtype)
            converted.add(id(weight))
    if converted:  # the rest leave the file they may be mapped from, which stays resident while any of them lives
        for p in model.parameters():
            if id(p) not in converted:
                p.data = p.data.clone()
    return len(converted)


def merge_and_save(model: torch.nn.Module, tokenizer: Any, path: str | Path, overwrite: bool = False) -> Path:
    """Save a plain transformers model (LoRA adapters merged into a copy) with its tokenizer, atomically."""
    from grouprl.rewards.reward_model import save_pretrained_atomic

    inner = unwrap_ddp(model)
    if is_peft(inner):
        plain = copy.deepcopy(inner)
        # a base stored in bf16 (store_frozen_linears) merges in the model's own format: small adapter
        # updates added to bf16 weights would round away
        store_frozen_linears(plain, plain.get_input_embeddings().weight.dtype)
        plain = plain.merge_and_unload()
    else:
        plain = inner
    return save_pretrained_atomic(plain, tokenizer, path, overwrite=overwrite)
