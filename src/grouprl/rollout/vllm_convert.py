"""Between grouprl's sampling types and vLLM's: one row's ``vllm.SamplingParams`` and a
:class:`~grouprl.types.RolloutBatch` from vLLM's completions. Nothing here imports ``vllm``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from grouprl.rollout.runner import left_pad
from grouprl.rollout.seeds import MODULUS, mix_seed
from grouprl.rollout.stops import cut_at_stop
from grouprl.rollout.turns import Conversations, Reply, TurnLimits
from grouprl.types import RolloutBatch, SamplingParams


def vllm_sampling_kwargs(params: SamplingParams, stop_token_ids: Sequence[int], seed: int | None,
                         max_tokens: int | None = None) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` drawing one completion as ``params`` says."""
    if params.mode != "sample":
        raise ValueError(f"the vLLM engine draws sampled groups only, not mode={params.mode!r}; use rollout_engine=hf")
    return {
        "n": 1, "temperature": params.temperature, "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,  # vLLM spells "off" as -1
        "min_p": params.min_p, "repetition_penalty": params.repetition_penalty,
        "max_tokens": params.max_new_tokens if max_tokens is None else max_tokens,
        "stop_token_ids": sorted(set(stop_token_ids)), "stop": list(params.stop_strings) or None,
        "include_stop_str_in_output": True, "logprobs": 0, "seed": None if seed is None else seed % MODULUS,
    }


def outputs_to_batch(completions: Sequence[Any], prompt_ids: list[list[int]], group_size: int, tokenizer: Any,
                     pad_id: int, stop_strings: tuple[str, ...], prompts: list | None = None,
                     extras: dict[str, list] | None = None) -> RolloutBatch:
    """A :class:`~grouprl.types.RolloutBatch` from B = P * G vLLM ``CompletionOutput`` s, as the built-in sampler's."""
    if len(completions) != len(prompt_ids) * group_size:
        raise ValueError(f"{len(completions)} completions for {len(prompt_ids)} prompts x {group_size}")
    tokens = [list(c.token_ids) for c in completions]
    logps = [[float(entry[t].logprob) for entry, t in zip(c.logprobs, ids)] for c, ids in zip(completions, tokens)]
    truncated = [c.finish_reason == "length" for c in completions]
    width = max(1, max(len(t) for t in tokens))
    ids = torch.full((len(tokens), width), pad_id, dtype=torch.long)  # [B, T]
    lp = torch.zeros(len(tokens), width)
    for i, (t, lps) in enumerate(zip(tokens, logps)):
        ids[i, : len(t)] = torch.tensor(t, dtype=torch.long)
        lp[i, : len(t)] = torch.tensor(lps)
    lengths = torch.tensor([len(t) for t in tokens])
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).float()  # [B, T]
    texts = tokenizer.batch_decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    if stop_strings:
        texts = [cut_at_stop(t, stop_strings)[0] for t in texts]
    p_ids, p_mask = left_pad([list(map(int, r)) for r in prompt_ids], pad_id, torch.device("cpu"))
    if prompts is None:
        prompts = tokenizer.batch_decode([list(r) for r in prompt_ids], skip_special_tokens=False)
    g = group_size
    return RolloutBatch(
        prompt_ids=p_ids.repeat_interleave(g, 0), prompt_mask=p_mask.repeat_interleave(g, 0), completion_ids=ids,
        completion_mask=mask, sampling_logprobs=lp, truncated=torch.tensor(truncated), completions=texts,
        prompts=[x for x in prompts for _ in range(g)], group_size=g, pad_token_id=pad_id,
        extras={k: [v for v in col for _ in range(g)] for k, col in (extras or {}).items()},
    )


def play_conversations(prompt_rows: list[list[int]], group_size: int, params: SamplingParams, limits: TurnLimits,
                       respond: Callable[[list[int], list[list[int]], list[bool]], list[Reply]], seeds: list[int],
                       stop_ids: list[int], complete: Callable[[list[int], list[list[int]], list[dict]], list[Any]]
                       ) -> Conversations:
    """:func:`grouprl.rollout.turns.decode_conversations` for an engine that samples whole turns with
    ``complete(rows, sequences, kwargs)`` (vLLM-style outputs), each with the row's seed mixed with its turn."""
    b = len(prompt_rows) * group_size
    seqs = [list(prompt_rows[i // group_size]) for i in range(b)]
    out = Conversations(tokens=[[] for _ in range(b)], from_policy=[[] for _ in range(b)],
                        logprobs=[[] for _ in range(b)], turns=[0] * b, end_reason=["env"] * b)
    running = list(range(b))
    while running:
        budget = {r: min(limits.max_new_tokens, limits.max_tokens - len(out.tokens[r])) for r in running}
        kwargs = [vllm_sampling_kwargs(params, stop_ids, mix_seed(seeds[r], out.turns[r]), budget[r])
                  for r in running]
        completions = complete(running, [seqs[r] for r in running], kwargs)
        turns = [list(c.token_ids) for c in completions]
        for r, c, ids in zip(running, completions, turns):
            out.tokens[r] += ids
            out.from_policy[r] += [True] * len(ids)
            out.logprobs[r] += [float(entry[t].logprob) for entry, t in zip(c.logprobs, ids)]
            seqs[r] += ids
        stopped = [bool(ids) and ids[-1] in stop_ids for ids in turns]
        replies = respond(running, turns, stopped)
        still = []
        for r, reply in zip(running, replies):
            if out.add_reply(r, reply, len(out.tokens[r]), limits):
                seqs[r] += reply.tokens
                still.append(r)
        running = still
    return out
