"""The built-in rollout engine: G completions per prompt (``params.mode``: G samples or the G best beams) from any
``transformers`` causal LM, by a decode loop over the live module's forward and KV cache.

>>> from grouprl.rollout.sampler import Sampler                          # doctest: +SKIP
>>> sampler = Sampler(model, tokenizer)                                  # doctest: +SKIP
>>> ids = sampler.encode(["What is 7+5?", "What is 3+9?"])               # doctest: +SKIP
>>> batch = sampler.generate(ids, group_size=4, params=SamplingParams(max_new_tokens=32), seed=0)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from grouprl.registry import Registry
from grouprl.rollout.beams import beam_groups, check_beam_request
from grouprl.rollout.cpu.compiled import CompiledStep
from grouprl.rollout.decoding import Decoded, DecodeRequest, row_uniforms, sample_groups
from grouprl.rollout.prompts import Prompt, encode_prompts
from grouprl.rollout.runner import check_format, eval_mode, left_pad, model_device, run_in_format, unwrap_model
from grouprl.rollout.seeds import resolve_row_seeds
from grouprl.rollout.stops import StopStringMatcher, cut_at_stop, pad_id, stop_token_ids
from grouprl.types import RolloutBatch, SamplingParams


def _no_extra_checks(params: SamplingParams, group_size: int, vocab: int, n_stop: int) -> None:
    return None


@dataclass(frozen=True)
class Mode:
    """A way to form the group: its decode loop and its own input checks (run before any work)."""

    decode: Callable[[DecodeRequest, int], Decoded]
    """(request, pad id) -> decoded rows, prompt-major."""
    check: Callable[[SamplingParams, int, int, int], None] = _no_extra_checks
    """(params, group size, vocabulary size, number of stop ids) -> None, or raise ValueError."""


MODES: Registry[Mode] = Registry("sampling mode")
MODES.register("sample", Mode(sample_groups))
MODES.register("beam", Mode(beam_groups, check_beam_request))


def check_params(params: SamplingParams) -> None:
    """Raise ``ValueError`` naming the first field of ``params`` that is out of range."""
    MODES.get(params.mode)
    checks = [
        ("max_new_tokens", params.max_new_tokens >= 1, "must be >= 1"),
        ("temperature", params.temperature >= 0.0, "must be >= 0 (0 = greedy)"),
        ("top_k", params.top_k >= 0, "must be >= 0 (0 = off)"),
        ("top_p", 0.0 < params.top_p <= 1.0, "must be in (0, 1] (1 = off)"),
        ("min_p", 0.0 <= params.min_p < 1.0, "must be in [0, 1) (0 = off)"),
        ("repetition_penalty", params.repetition_penalty > 0.0, "must be > 0 (1 = off)"),
    ]
    for name, ok, rule in checks:
        if not ok:
            raise ValueError(f"SamplingParams.{name} {rule}, got {getattr(params, name)!r}")


def _check_inputs(prompt_ids: Sequence[Sequence[int]], group_size: int, prompts: list | None,
                  extras: dict[str, list] | None) -> None:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be an integer >= 1, got {group_size!r}")
    if len(prompt_ids) == 0:
        raise ValueError("prompt_ids is empty: give at least one prompt")
    for p, ids in enumerate(prompt_ids):
        if len(ids) == 0:
            raise ValueError(f"prompt {p} has no tokens")
    n = len(prompt_ids)
    if prompts is not None and len(prompts) != n:
        raise ValueError(f"prompts has {len(prompts)} entries for {n} prompt_ids")
    for name, column in (extras or {}).items():
        if len(column) != n:
            raise ValueError(f"extras column {name!r} has {len(column)} entries for {n} prompts (one per prompt)")


def _check_vocab(ids: torch.Tensor, mask: torch.Tensor, vocab: int) -> None:
    """ids / mask [P, Lp]: every real token must index the model's embedding table."""
    bad = ((ids < 0) | (ids >= vocab)) & (mask > 0)  # [P, Lp]
    if bad.any():
        row = int(bad.any(1).nonzero()[0])
        raise ValueError(f"prompt {row} has token ids outside the model's vocabulary [0, {vocab}): "
                         f"{ids[row][bad[row]].tolist()[:5]}")


class Sampler:
    """Batched KV-cache sampling on the live policy. ``share_prefill`` and ``compact`` exist to check that the two
    optimisations change nothing. ``sampling_logprobs`` are under the distribution each token was drawn from
    (after penalty, temperature and filters; greedy: T = 1)."""

    def __init__(self, model: nn.Module, tokenizer: Any, *, share_prefill: bool = True, compact: bool = True,
                 compile_steps: bool = False):
        self.model = model
        self.tokenizer = tokenizer
        self.share_prefill = share_prefill
        self.compact = compact
        self.compiled = CompiledStep() if compile_steps else None  # kept across rollouts
        self._matchers: dict[tuple[str, ...], StopStringMatcher] = {}

    # -- the engine protocol: nothing to copy, free, cancel or sample ahead ----------------------------------
    uses_live_model = True

    @property
    def compiles(self) -> bool:
        return self.compiled is not None

    def update_weights(self, model: nn.Module) -> None:

        self.model = model

    def phase(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def rest(self) -> None:
        return None

    def cancel(self) -> None:
        return None

    def close(self) -> None:
        return None

    def sample_ahead(self) -> None:
        return None

    def metrics(self) -> dict[str, float]:
        return self.compiled.metrics() if self.compiled is not None else {}

    def encode(self, prompts: Sequence[Prompt], *, system_prompt: str | None = None,
               use_chat_template: bool = True) -> list[list[int]]:

        return encode_prompts(self.tokenizer, prompts, system_prompt=system_prompt,
                              use_chat_template=use_chat_template)

    @property
    def pad_token_id(self) -> int:
        return pad_id(self.tokenizer)

    def stop_token_ids(self, params: SamplingParams) -> list[int]:
        """The tokenizer's and generation config's EOS ids and ``params.stop_token_ids``."""
        ids = set(stop_token_ids(self.tokenizer, params))
        gen_eos = getattr(getattr(unwrap_model(self.model), "generation_config", None), "eos_token_id", None)
        if gen_eos is not None:
            ids.update([gen_eos] if isinstance(gen_eos, int) else gen_eos)
        return sorted(ids)

    def _matcher(self, stop_strings: tuple[str, ...], vocab: int) -> StopStringMatcher | None:
        if not stop_strings:
            return None
        if stop_strings not in self._matchers:
            self._matchers[stop_strings] = StopStringMatcher(self.tokenizer, stop_strings, vocab)
        return self._matchers[stop_strings]

    def generate(self, prompt_ids: list[list[int]], group_size: int, params: SamplingParams, *,
                 seed: int | Sequence[int] | None = None, prompts: list | None = None,
                 extras: dict[str, list] | None = None) -> RolloutBatch:
        """As :meth:`~grouprl.rollout.protocol.RolloutEngine.generate`; row b's draws depend on its seed alone."""
        check_params(params)
        _check_inputs(prompt_ids, group_size, prompts, extras)
        vocab = unwrap_model(self.model).get_input_embeddings().num_embeddings
        device = model_device(self.model)
        check_format(params.format, device)
        row_seeds = resolve_row_seeds(seed, len(prompt_ids) * group_size)
        pad_id = self.pad_token_id
        ids, mask = left_pad([list(map(int, r)) for r in prompt_ids], pad_id, device)
        _check_vocab(ids, mask, vocab)
        req = DecodeRequest(
            model=self.model, prompt_ids=ids, prompt_mask=mask, group_size=group_size, params=params,
            stop_ids=torch.tensor(self.stop_token_ids(params), dtype=torch.long, device=device),
            matcher=self._matcher(tuple(params.stop_strings), vocab),
            uniforms=row_uniforms(row_seeds, params.max_new_tokens, device) if params.temperature > 0 else None,
            share_prefill=self.share_prefill, compact=self.compact, compiled=self.compiled,
        )
        mode = MODES.get(params.mode)
        mode.check(params, group_size, vocab, req.stop_ids.numel())
        decode = partial(mode.decode, pad_id=pad_id)
        with eval_mode(self.model), torch.inference_mode():
            out = run_in_format(params.format, self.model, lambda _: decode(req))
        return self._assemble(req, out, prompt_ids, prompts, extras)

    def _assemble(self, req: DecodeRequest, out: Decoded, prompt_ids: list[list[int]], prompts: list | None,
                  extras: dict[str, list] | None) -> RolloutBatch:
        g = req.group_size
        lengths = out.lengths.tolist()
        texts = self.tokenizer.batch_decode(
            [row[:n] for row, n in zip(out.tokens.tolist(), lengths)],
            skip_special_tokens=True, clean_up_tokenization_spaces=False,
        )
        if req.params.stop_strings:
            texts = [cut_at_stop(t, tuple(req.params.stop_strings))[0] for t in texts]
        if prompts is None:
            prompts = self.tokenizer.batch_decode([list(r) for r in prompt_ids], skip_special_tokens=False)
        mask = (torch.arange(out.tokens.shape[1], device=out.tokens.device).unsqueeze(0)
                < out.lengths.unsqueeze(1)).float()  # [B, T]
        # inference-mode tensors cannot be saved for backward, and the loss multiplies these: clone them
        return RolloutBatch(
            prompt_ids=req.prompt_ids.repeat_interleave(g, 0), prompt_mask=req.prompt_mask.repeat_interleave(g, 0),
            completion_ids=out.tokens.clone(), completion_mask=mask, sampling_logprobs=out.logprobs.clone(),
            truncated=out.truncated.clone(), completions=texts, prompts=[p for p in prompts for _ in range(g)],
            group_size=g, pad_token_id=self.pad_token_id,
            extras={k: [v for v in col for _ in range(g)] for k, col in (extras or {}).items()})

