"""Multi-turn decoding on one KV cache, token in, token out, for a batch of trajectories at once. A row whose turn
ended feeds a masked hole (its positions do not advance), so no row waits; ``respond`` gives each row's reply ids,
prefilled onto the same cache with its last sampled token. Each row draws from its own seed.

Shapes: P initial prompts, G trajectories each, B = P * G rows, b rows still running, V vocabulary."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from grouprl.rollout.cpu.compiled import CompiledStep
from grouprl.rollout.decoding import row_uniforms, rows_to_keep
from grouprl.rollout.picking import pick_tokens
from grouprl.rollout.runner import Runner, left_pad, positions_from_mask
from grouprl.types import SamplingParams


@dataclass(frozen=True)
class TurnLimits:
    max_new_tokens: int
    """Most tokens the policy samples in one turn."""
    max_turns: int
    max_tokens: int
    """Most tokens after the initial prompt, the environment's included."""


@dataclass
class Reply:
    tokens: list[int] | None
    """Token ids to append as context (None: the trajectory is over)."""
    reason: str = "env"


Respond = Callable[[list[int], list[list[int]], list[bool]], list[Reply]]
"""``(rows, each row's sampled turn tokens, whether each turn ended on a stop token) -> replies``."""


@dataclass
class Conversations:
    """B decoded trajectories, token level; everything after each row's initial prompt."""

    tokens: list[list[int]]
    """Per row: the policy's and the environment's tokens, in order."""
    from_policy: list[list[bool]]
    logprobs: list[list[float]]
    """Per row and token: the sampling log-prob (0.0 on environment tokens)."""
    turns: list[int] = field(default_factory=list)
    end_reason: list[str] = field(default_factory=list)
    """env, length (the token budget), turns (``max_turns``), or the reason a ``Reply`` gave."""

    @property
    def truncated(self) -> list[bool]:
        """Rows a budget cut off (not ended by their environment)."""
        return [r in ("length", "turns") for r in self.end_reason]

    def add_reply(self, row: int, reply: Reply, used: int, limits: TurnLimits) -> bool:
        """Count ``row``'s turn and append ``reply``; False when the trajectory ends instead."""
        self.turns[row] += 1
        reason = _ended(reply, used, self.turns[row], limits)
        if reason is not None:
            self.end_reason[row] = reason
            return False
        self.tokens[row].extend(reply.tokens)
        self.from_policy[row].extend([False] * len(reply.tokens))
        self.logprobs[row].extend([0.0] * len(reply.tokens))
        return True


class _Batch:
    def __init__(self, rows: torch.Tensor, attn: torch.Tensor, device: torch.device):
        self.rows = rows  # [b] original row of each running row
        self.live = torch.ones_like(rows, dtype=torch.bool)  # [b] False on passengers
        self.attn = attn  # [b, columns] long: 1 on real tokens, 0 on padding and holes
        self.pos = attn.sum(-1)  # [b] position of the next real token
        self.sampled = torch.zeros_like(self.rows)  # [b] tokens sampled so far (the uniforms' index)
        self.used = torch.zeros_like(self.rows)  # [b] tokens after the prompt so far
        self.device = device

    def keep(self, going: torch.Tensor, runner: Runner) -> list[int]:
        """Keep the ``going`` [b] rows, topped up with passengers; the kept rows' former indices."""
        keep = rows_to_keep(going, runner.fewest_rows)  # [b']
        if len(keep) < len(self.rows):
            runner.select_rows(keep)
        self.live = going[keep]
        self.rows, self.attn, self.pos = self.rows[keep], self.attn[keep], self.pos[keep]
        self.sampled, self.used = self.sampled[keep], self.used[keep]
        return keep.tolist()

    def feed(self, runner: Runner, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Append a block ``ids [b, k]`` (``mask`` 1 on real tokens, right-aligned) to every row;
        returns each row's next-token logits [b, V]."""
        positions = self.pos.unsqueeze(1) + (mask.cumsum(-1) - 1).clamp(min=0)  # [b, k]
        self.attn = torch.cat([self.attn, mask], 1)
        self.pos = self.pos + mask.sum(-1)
        return runner.forward(ids, self.attn, positions)


def decode_conversations(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                         group_size: int, params: SamplingParams, limits: TurnLimits, respond: Respond,
                         row_seeds: list[int], stop_ids: torch.Tensor, pad_id: int,
                         compiled: CompiledStep | None = None) -> Conversations:
    """Decode G conversations for each of P left-padded prompts ``[P, Lp]``; ``respond`` is called once per turn
    with the rows whose turn just ended, ``row_seeds`` are B seeds, ``stop_ids`` [n_stop] end a turn."""
    if params.repetition_penalty != 1.0:
        raise ValueError("repetition_penalty is not available for multi-turn rollouts (the environment's tokens "
                         "would count as repetitions)")
    device = prompt_ids.device
    b_all = prompt_ids.shape[0] * group_size
    runner = Runner(model, capacity=prompt_ids.shape[1] + limits.max_tokens + limits.max_turns, compiled=compiled,
                    fmt=params.format)
    logits = runner.forward(prompt_ids, prompt_mask, positions_from_mask(prompt_mask))  # [P, V]
    runner.repeat_rows(group_size)
    logits = logits.repeat_interleave(group_size, 0)  # [B, V]
    batch = _Batch(torch.arange(b_all, device=device), prompt_mask.repeat_interleave(group_size, 0).long(), device)
    uniforms = (row_uniforms(row_seeds, limits.max_tokens, device) if params.temperature > 0 else None)  # [B, N]
    out = Conversations(tokens=[[] for _ in range(b_all)], from_policy=[[] for _ in range(b_all)],
                        logprobs=[[] for _ in range(b_all)], turns=[0] * b_all, end_reason=["env"] * b_all)
    while bool(batch.live.any()):
        turn_tokens, stopped, logits = _decode_turn(runner, batch, logits, params, limits, uniforms, stop_ids,
                                                    pad_id, out)
        live = batch.live.nonzero().flatten().tolist()
        rows = batch.rows[live].tolist()
        replies = respond(rows, [turn_tokens[i] for i in live], [stopped[i] for i in live])
        blocks: dict[int, list[int]] = {}  # batch index -> what it is fed next
        for i, row, reply in zip(live, rows, replies, strict=True):
            if out.add_reply(row, reply, int(batch.used[i]), limits):
                blocks[i] = [turn_tokens[i][-1], *reply.tokens]  # the last sampled token is fed with the reply
        if not blocks:
            break
        going = torch.zeros(len(batch.rows), dtype=torch.bool)
        going[list(blocks)] = True
        kept = batch.keep(going.to(device), runner)
        fed = [blocks.get(i, []) for i in kept]  # a passenger is fed a masked hole
        batch.used += torch.tensor([max(len(blk) - 1, 0) for blk in fed], dtype=torch.long, device=device)
        ids, mask = left_pad(fed, pad_id, device)
        logits = batch.feed(runner, ids, mask)
    return out


def _ended(reply: Reply, used: int, turns: int, limits: TurnLimits) -> str | None:
    """Why the row's trajectory ends after this turn, or None when it goes on."""
    if reply.tokens is None:
        return reply.reason
    if turns >= limits.max_turns:
        return "turns"
    if used + len(reply.tokens) >= limits.max_tokens:  # the reply leaves no room for another token
        return "length"
    return None


def _decode_turn(runner: Runner, batch: _Batch, logits: torch.Tensor, params: SamplingParams, limits: TurnLimits,
                 uniforms: torch.Tensor | None, stop_ids: torch.Tensor, pad_id: int,
                 out: Conversations) -> tuple[list[list[int]], list[bool], torch.Tensor]:
    """One turn of every running row: (its sampled tokens, whether it ended on a stop token, the logits after the
    last fed column); the last sampled token is not fed."""
    b = len(batch.rows)
    turn_tokens: list[list[int]] = [[] for _ in range(b)]
    in_turn = batch.live.clone()  # a passenger's draws are discarded
    stopped = torch.zeros(b, dtype=torch.bool, device=batch.device)
    for step in range(limits.max_new_tokens):
        u = None if uniforms is None else uniforms[batch.rows, batch.sampled.clamp(max=uniforms.shape[1] - 1)]
        tokens, logprobs = pick_tokens(logits, params, u)  # [b], [b]
        for i in in_turn.nonzero().flatten().tolist():
            row = int(batch.rows[i])
            turn_tokens[i].append(int(tokens[i]))
            out.tokens[row].append(int(tokens[i]))
            out.from_policy[row].append(True)
            out.logprobs[row].append(float(logprobs[i]))
        batch.sampled += in_turn.long()
        batch.used += in_turn.long()
        is_stop = in_turn & torch.isin(tokens, stop_ids)
        stopped |= is_stop
        going = in_turn & ~is_stop & (batch.used < limits.max_tokens)
        if step == limits.max_new_tokens - 1 or not going.any():
            break
        logits = batch.feed(runner, torch.where(going, tokens, torch.full_like(tokens, pad_id)).unsqueeze(1),
                            going.long().unsqueeze(1))
        in_turn = going
    return turn_tokens, stopped.tolist(), logits
