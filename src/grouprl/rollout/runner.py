"""A Hugging Face causal LM one decode step at a time on its KV cache, with ``position_ids`` that skip left
padding (as ``model.generate`` and :mod:`.logprobs`)."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from grouprl.rollout.attention import decoding, sdpa_configs
from grouprl.rollout.cache import make_cache
from grouprl.rollout.cpu.compiled import CompiledStep
from grouprl.rollout.cpu.layer_loop import LayerLoop, float_rows
from grouprl.rollout.cpu.weight_only import Copies, model_linears, weight_only_products
from grouprl.rollout.formats import FORMATS, format_problem


def unwrap_model(model: nn.Module) -> nn.Module:
    """The ``transformers`` model inside a peft wrapper (LoRA layers stay injected), else ``model``."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def model_device(model: nn.Module) -> torch.device:
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def left_pad(rows: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists: ``([n, L] long ids, [n, L] long mask)``, ``L`` the longest row."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device)


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[n, L]`` position ids that skip left padding (pads get 0, like ``model.generate``)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


class _WholeCall(nn.Module):
    """Lets ``torch.func.functional_call`` substitute weights for a whole decode loop, not one call."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, fn: Callable[[nn.Module], Any]) -> Any:
        return fn(self.model)


def run_with_bf16_weights(model: nn.Module, fn: Callable[[nn.Module], Any]) -> Any:
    """``fn(model)`` on bf16 copies of the fp32 parameters (autocast alone re-casts each weight at every call)."""
    wrapper = _WholeCall(model)
    params = {name: p.to(torch.bfloat16) if p.dtype == torch.float32 else p for name, p in wrapper.named_parameters()}
    with torch.autocast(model_device(model).type, dtype=torch.bfloat16):
        return torch.func.functional_call(wrapper, params, (fn,), tie_weights=True, strict=False)


def run_in_format(fmt: str, model: nn.Module, fn: Callable[[nn.Module], Any]) -> Any:
    """``fn(model)`` as a decode loop runs in rollout format ``fmt``: on weight copies where the format makes them."""
    return run_with_bf16_weights(model, fn) if FORMATS.get(fmt).copy_dtype is torch.bfloat16 else fn(model)


def check_format(fmt: str, device: torch.device) -> None:
    """Raise ``ValueError`` for a ``SamplingParams.format`` that is unknown or cannot run on ``device``."""
    if fmt not in FORMATS:
        raise ValueError(f"SamplingParams.format must be one of {', '.join(FORMATS.names())}, got {fmt!r}")
    problem = format_problem(fmt, device)
    if problem:
        raise ValueError(f"SamplingParams.format {problem}: use fp32 or bf16")


def _contiguous_input(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return (args[0].contiguous(), *args[1:]) if args and torch.is_tensor(args[0]) else args


class Runner:
    """Prefill and decode steps of ``model`` on a cache of ``capacity`` positions; on a CPU one-token steps run
    through :mod:`.cpu.layer_loop` (``compiled``: as one graph), and a weight-only ``fmt`` on weight copies."""

    def __init__(self, model: nn.Module, capacity: int, compiled: CompiledStep | None = None, fmt: str = "fp32"):
        self.model = model
        weight_only = FORMATS.get(fmt).weight_only
        self.copies = Copies(weight_only) if weight_only is not None else None
        self.compiled = compiled if self.copies is None else None
        self._loop = LayerLoop.plan(unwrap_model(model)) if model_device(model).type == "cpu" else None
        self._linears = model_linears(unwrap_model(model)) if self.copies is not None else []
        self.cache = make_cache(unwrap_model(model), capacity)
        forward = inspect.signature(type(unwrap_model(model)).forward).parameters
        self._extra = {"logits_to_keep": 1} if "logits_to_keep" in forward else {}
        # transformers 5.24 renamed past_key_values to cache: use the name this forward takes
        self._cache_name = "cache" if "cache" in forward else "past_key_values"
        self._sdpa = sdpa_configs(unwrap_model(model))  # decode steps attend without SDPA's copies of the cache
        head = unwrap_model(model).get_output_embeddings() if hasattr(unwrap_model(model), "get_output_embeddings") \
            else None
        self._head = head if isinstance(head, nn.Module) else None

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Append ``ids`` [b, q] (``attention_mask`` [b, n + q], ``position_ids`` [b, q]); the last position's
        logits [b, V] float32."""
        one_token = ids.shape[1] == 1
        products = weight_only_products(self._linears, self.copies) if self.copies is not None and one_token else \
            contextlib.nullcontext()
        if self._loop is not None and self._loop.covers(self.cache, ids):
            if self.compiled is not None:
                logits = self.compiled.run(self._loop, ids, attention_mask, position_ids, self.cache)
                if logits is not None:
                    return logits
            with products:
                return self._loop.step(ids, attention_mask, position_ids, self.cache)
        # a strided slice of a prefill's last positions would make matmul expand the LM head's weight to every row
        hook = self._head.register_forward_pre_hook(_contiguous_input) if self._head is not None else None
        with decoding(self._sdpa), products, contextlib.ExitStack() as stack:
            if hook is not None:
                stack.callback(hook.remove)
            out = self.model(
                input_ids=ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=True,
                **{self._cache_name: self.cache},
                **self._extra,
            )
        returned = getattr(out, self._cache_name)
        if returned is not None and returned is not self.cache:
            self.cache = returned
        return float_rows(out.logits[:, -1, :])

    @property
    def fewest_rows(self) -> int:
        """Rows worth keeping in a step even when fewer are running."""
        return self.compiled.fewest_rows if self.compiled is not None else 1

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep cache rows ``rows`` ([b'] long, in that order)."""
        self.cache.batch_select_indices(rows)

    def repeat_rows(self, repeats: int) -> None:
        """Row ``i`` becomes rows ``i*repeats .. i*repeats+repeats-1`` (prompt -> its group)."""
        self.cache.batch_repeat_interleave(repeats)


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
