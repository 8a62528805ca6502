"""The policy and its frozen reference as the trainer uses them: setup, log-prob passes, reference sync."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from grouprl.models import LoraSettings, apply_lora, is_peft, make_reference, reference_context
from grouprl.models.activations import checkpoint_activations, keep_fewer_activations
from grouprl.models.casts import lean_casts
from grouprl.rollout.logprobs import token_logprobs
from grouprl.trainer.config import TrainerConfig
from grouprl.types import RolloutBatch


def prepare_policy(policy: nn.Module, config: TrainerConfig) -> nn.Module:
    """``policy`` with LoRA adapters and gradient checkpointing (or leaner activations) as configured."""
    if config.lora_rank and not is_peft(policy):
        with torch.random.fork_rng(devices=[]):  # the adapters' start follows the run's seed alone
            torch.manual_seed(config.seed)
            policy = apply_lora(policy, LoraSettings(rank=config.lora_rank, alpha=config.lora_alpha,
                                                     dropout=config.lora_dropout,
                                                     target_modules=tuple(config.lora_target_modules)))
    if config.checkpointing:
        checkpoint_activations(policy)
    else:
        keep_fewer_activations(policy)
    return policy


def default_reference(policy: nn.Module, config: TrainerConfig) -> nn.Module | None:
    """A frozen copy of ``policy`` when the objective has a KL term and no LoRA base can stand in; else None."""
    if not config.needs_reference or is_peft(policy):
        return None
    return make_reference(policy, torch.bfloat16 if config.reference_bf16 else None)


def bf16_base_fits(policy: nn.Module, config: TrainerConfig, processes: Any, own_weights: bool) -> bool:
    """A LoRA base can be stored in bf16: every pass that reads it runs in bf16, and one CPU process holds the
    model whole (FSDP keeps a layer's parameters in one format)."""
    return (is_peft(policy) and config.train_bf16 and (config.rollout_bf16 or own_weights)
            and processes.world_size == 1 and processes.device is None)


def micro_batches(rows: torch.Tensor, live: torch.Tensor | None, size: int, in_step: bool) -> list[torch.Tensor]:
    """``rows`` (``[n]``) in passes of at most ``size`` less the rows not ``live`` (``[B]`` bool); an emptied pass
    is skipped, or with ``in_step`` (processes must make the same passes) keeps its first row."""
    out = []
    for chunk in rows.split(size):
        kept = chunk if live is None else chunk[live[chunk].to(chunk.device)]
        if len(kept):
            out.append(kept)
        elif in_step:
            out.append(chunk[:1])
    return out


def _sharded(model: nn.Module) -> bool:

    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in model.modules())


def model_device_type(model: nn.Module) -> str:
    return next((p.device.type for p in model.parameters()), "cpu")


class PolicyPasses:
    """Log-prob passes over a rollout batch through the process group's ``forward_model`` wrapper."""

    def __init__(self, policy: nn.Module, reference: nn.Module | None, config: TrainerConfig, forward_model: Any,
                 in_step: bool = False):
        self.policy, self.reference, self.config = policy, reference, config
        self.forward_model, self.in_step = forward_model, in_step

    def logprobs(self, model: nn.Module, batch: RolloutBatch, rows: torch.Tensor | None = None,
                 with_entropy: bool = False, only: torch.Tensor | None = None, temperature: float | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor | None] | torch.Tensor:
        """Per-token log-probs under ``model``. With ``rows`` (a micro-batch, with grad): ``(logp [b, T], entropy
        [b, T] or None)``. Without: no grad, ``[B, T]``, only the rows where ``only [B]`` is true (0 elsewhere).
        ``temperature``: the distribution scored (default the sampling temperature, 1 for greedy)."""
        c = self.config
        model = self.forward_model(model)
        device_type = model_device_type(model)
        temperature = temperature or (c.temperature if c.temperature > 0 else 1.0)
        if rows is not None:
            # bf16 casts are redone in backward rather than kept (grouprl.models.casts); not under FSDP.
            lean = c.train_bf16 and torch.is_grad_enabled() and not _sharded(model)
            with (torch.autocast(device_type, dtype=torch.bfloat16, enabled=c.train_bf16, cache_enabled=not lean),
                  lean_casts() if lean else contextlib.nullcontext()):
                return self._pass(model, batch, rows, temperature, with_entropy)
        autocast = torch.autocast(device_type, dtype=torch.bfloat16, enabled=c.train_bf16)
        out = torch.zeros(batch.completion_ids.shape, dtype=torch.float32, device=batch.completion_ids.device)
        live = None if only is None else only.cpu()
        with torch.no_grad(), autocast:
            for chunk in micro_batches(torch.arange(batch.batch_size), live, c.micro_batch_size, self.in_step):
                out[chunk.to(out.device)] = self._pass(model, batch, chunk, temperature, False)[0].float()
        return out

    def _pass(self, model: nn.Module, batch: RolloutBatch, rows: torch.Tensor, temperature: float,
              with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        sequence = None if batch.sequence_mask is None else batch.sequence_mask[rows]
        return token_logprobs(model, batch.prompt_ids[rows], batch.prompt_mask[rows], batch.completion_ids[rows],
                              batch.completion_mask[rows], temperature=temperature,
                              chunk_size=self.config.logprob_chunk_size, with_entropy=with_entropy,
                              packed=self.config.packing, sequence_mask=sequence)

    def old_logprobs(self, batch: RolloutBatch, only: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, T]`` log-probs under pi_old."""
        return self.logprobs(self.policy, batch, only=only)

    def reference_logprobs(self, batch: RolloutBatch, only: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, T]`` log-probs under pi_ref."""
        with reference_context(self.policy, self.reference) as ref:
            return self.logprobs(ref, batch, only=only)

    def sync_reference(self, alpha: float) -> None:
        """ref <- alpha * policy + (1 - alpha) * ref (TR-DPO style soft update; alpha = 1 copies)."""
        with torch.no_grad():
            for r, p in zip(self.reference.parameters(), self.policy.parameters()):
                r.mul_(1 - alpha).add_(p.detach().to(r.dtype), alpha=alpha)
