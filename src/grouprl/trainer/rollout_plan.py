"""What serves a run's rollouts, and why: format, engine, compilation and rollout correction, decided once at
start (:func:`plan_rollout`, recorded in summary.json and checkpoints); :func:`build_rollout` then builds the
engine. The plan comes before the policy is placed (a LoRA base goes bf16 only where no pass reads it in fp32),
the engine after the prompts are encoded (vLLM is sized for the longest).

Engines (:data:`ENGINES`): ``hf`` the built-in KV-cache engine on the live policy, ``vllm`` in this process,
``servers`` separate ``grouprl serve`` processes (whenever ``rollout_servers`` is set), or a sampler passed in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from grouprl.models import unwrap_ddp
from grouprl.registry import Registry
from grouprl.rollout.engines import resolve_compile, resolve_engine
from grouprl.rollout.formats import FORMATS
from grouprl.rollout.protocol import RolloutEngine
from grouprl.trainer.evaluate import EVAL_BATCH
from grouprl.trainer.resolved import rollout_is_for

if TYPE_CHECKING:
    from grouprl.trainer.config import TrainerConfig


@dataclass(frozen=True)
class RolloutPlan:
    """What a run's rollouts resolved to at start, each choice with its reason."""

    formats: str
    rollout_format: str
    engine: str
    """An :data:`ENGINES` name, or the class of a sampler passed in."""
    engine_reason: str
    compile: bool
    compile_reason: str
    rollout_is: str
    own_weights: bool
    """The engine samples from its own copy of the weights, pushed after each update."""
    weights_transport: str = ""
    """A :data:`grouprl.serve.weights.transport.TRANSPORTS` name; empty without servers."""
    weights_transport_reason: str = ""

    def setup(self) -> dict[str, str]:
        lines = {"formats": self.formats, "rollout_engine": f"{self.engine} ({self.engine_reason})",
                 "rollout_compile": f"{'on' if self.compile else 'off'} ({self.compile_reason})",
                 "rollout_is": self.rollout_is}
        if self.weights_transport:
            lines["rollout_weights_transport"] = f"{self.weights_transport} ({self.weights_transport_reason})"
        return lines

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Engine:
    build: Callable[[Any, RolloutPlan, nn.Module, Any, int, bool], Any]
    """(config, plan, policy, tokenizer, longest sequence, multi-turn) -> the sampler or None."""
    own_weights: bool


def _built_in(config: TrainerConfig, plan: RolloutPlan, policy: nn.Module, tokenizer: Any, longest: int,
              multi_turn: bool) -> Any:
    from grouprl.rollout.sampler import Sampler

    return None if multi_turn else Sampler(unwrap_ddp(policy), tokenizer, compile_steps=plan.compile)


def _vllm(config: TrainerConfig, plan: RolloutPlan, policy: nn.Module, tokenizer: Any, longest: int,
          multi_turn: bool) -> Any:
    return vllm_engine(config, policy, tokenizer, longest)


def _servers(config: TrainerConfig, plan: RolloutPlan, policy: nn.Module, tokenizer: Any, longest: int,
             multi_turn: bool) -> Any:
    from grouprl.trainer.rollout_servers import server_sampler

    return server_sampler(config, unwrap_ddp(policy), tokenizer, longest, transport=plan.weights_transport)


ENGINES: Registry[Engine] = Registry("rollout engine")
ENGINES.register("hf", Engine(_built_in, own_weights=False))
ENGINES.register("vllm", Engine(_vllm, own_weights=True))
ENGINES.register("servers", Engine(_servers, own_weights=True))


def vllm_engine(config: TrainerConfig, policy: nn.Module, tokenizer: Any, max_model_len: int) -> Any:
    """A colocated vLLM engine following ``policy``, in the rollout format ``dtype`` chose."""
    from grouprl.rollout.vllm import VLLMSampler

    c = config
    rows = max(c.rollout_rows, EVAL_BATCH * c.eval_samples)
    return VLLMSampler(unwrap_ddp(policy), tokenizer, max_model_len=max_model_len,
                       dtype=FORMATS.get(c.rollout_format).vllm_dtype, seed=c.seed,
                       lora_rank=c.lora_rank or None, gpu_memory_utilization=c.vllm_gpu_memory_utilization,
                       sleep=c.vllm_sleep, kv_cache_gib=c.vllm_kv_cache_gib, max_rows=rows,
                       compiled=c.vllm_compile)


def plan_rollout(config: TrainerConfig, formats: Any, policy: nn.Module, device: torch.device | None, *,
                 multi_turn: bool, sampler: RolloutEngine | None = None, steps: int | None = None) -> RolloutPlan:
    """The run's :class:`RolloutPlan`; a request the run cannot honour is a ConfigError before any engine starts."""
    c = config
    if sampler is not None:
        own = not sampler.uses_live_model
        why = f"a {type(sampler).__name__} was passed in"
        return RolloutPlan(formats.describe(), c.rollout_format, type(sampler).__name__, why, sampler.compiles, why,
                           rollout_is_for(c, own), own)
    servers = getattr(c, "rollout_servers", None)
    transport = ("", "")
    if servers:
        from grouprl.serve.weights.transport import resolve_transport

        engine, why = "servers", f"rollout_servers={servers if isinstance(servers, int) else ','.join(servers)}"
        compiles, compile_why = False, "the rollout servers run vLLM"
        transport = resolve_transport(c.rollout_weights_transport, device or _device_of(policy),
                                      local_servers=isinstance(servers, int))
    else:
        compiles, compile_why = resolve_compile(c.rollout_compile, c.rollout_engine, c.rollout_format, policy, device,
                                                steps=c.total_steps if steps is None else steps)
        engine, why = resolve_engine(c.rollout_engine, policy, c.rollout_mode, multi_turn=multi_turn,
                                     compile_steps=compiles, rollout_format=c.rollout_format)
    own = ENGINES.get(engine).own_weights
    return RolloutPlan(formats.describe(), c.rollout_format, engine, why, compiles, compile_why,
                       rollout_is_for(c, own), own, *transport)


def _device_of(policy: nn.Module) -> torch.device | None:
    return next((p.device for p in policy.parameters()), None)


def build_rollout(config: TrainerConfig, plan: RolloutPlan, policy: nn.Module, tokenizer: Any, *, longest: int,
                  multi_turn: bool = False, sampler: RolloutEngine | None = None) -> RolloutEngine | None:
    """The rollout engine ``plan`` names on the placed ``policy``, holding ``longest`` tokens (None: the live one)."""
    if sampler is not None:
        if sampler.uses_live_model:
            sampler.update_weights(unwrap_ddp(policy))  # decode through the root (FSDP) or the module inside DDP
        return sampler
    return ENGINES.get(plan.engine).build(config, plan, policy, tokenizer, longest, multi_turn)
