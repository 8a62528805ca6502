"""Agents in text environments: conversations decoded together on one KV cache (:mod:`.turns`) into a
:class:`~grouprl.types.RolloutBatch` whose environment tokens are context only. Sampled ids are kept as sampled;
the bridge to the next turn is the difference of two renders (templates are not append-only), and a template that
rewrites earlier turns ends the trajectory (``template``)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from grouprl.data.prompt_sets import context_overflow
from grouprl.data.templates import Rendered, render
from grouprl.envs.episode import respond_all
from grouprl.errors import EnvError, PromptTooLongError
from grouprl.rollout.cpu.compiled import CompiledStep
from grouprl.rollout.runner import check_format, eval_mode, left_pad, model_device, run_in_format
from grouprl.rollout.seeds import resolve_row_seeds
from grouprl.rollout.stops import pad_id, stop_token_ids
from grouprl.rollout.turns import Conversations, Reply, TurnLimits, decode_conversations
from grouprl.types import RolloutBatch, SamplingParams

PLACEHOLDER = "\u2063grouprl-turn\u2063"  # an assistant turn's content while templates are diffed


class ChatRenderer:
    """Renders conversations with the chat template and finds the tokens joining a policy turn to the next."""

    def __init__(self, tokenizer: Any, tools: Sequence[Any] = (), system_prompt: str | None = None,
                 tools_prompt: str | None = None):
        self.tokenizer = tokenizer
        schemas = [t.schema for t in tools]
        probe = [{"role": "user", "content": "x"}]
        native = bool(schemas) and self._render(probe, schemas, True) != self._render(probe, None, True)
        self.tools = schemas if native else None
        # a template that ignores ``tools=`` gets them described in the system message
        parts = [p for p in (system_prompt, None if native or not schemas else tools_prompt) if p]
        self.system = "\n\n".join(parts) or None

    def _render(self, messages: list[dict], tools: list | None, generation_prompt: bool) -> str:
        return self._rendered(messages, tools, generation_prompt).text

    def _rendered(self, messages: list[dict], tools: list | None, generation_prompt: bool) -> Rendered:
        return render(self.tokenizer, messages, tools=tools, add_generation_prompt=generation_prompt)

    def with_system(self, messages: list[dict]) -> list[dict]:
        if self.system is None or any(m.get("role") == "system" for m in messages):
            return list(messages)
        return [{"role": "system", "content": self.system}, *messages]

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """Token ids of the conversation so far, ending in the assistant's generation prompt."""
        return self._rendered(self.with_system(messages), self.tools, True).ids(self.tokenizer)

    def reply_ids(self, history: list[dict], new: list[dict], stop_text: str | None) -> list[int] | None:
        """Token ids after the policy's last turn (the last of ``history``) up to the next generation prompt: the end
        of that turn (less ``stop_text``, which the policy drew itself) and the ``new`` messages; None when the
        template rewrites earlier turns."""
        history = self.with_system(history)
        history[-1] = {**history[-1], "content": PLACEHOLDER}
        base = self._render(history, self.tools, False)
        full = self._rendered(history + list(new), self.tools, True)
        if not full.text.startswith(base) or PLACEHOLDER not in base:
            return None
        start = base.rindex(PLACEHOLDER) + len(PLACEHOLDER)
        if stop_text and full.text.startswith(stop_text, start):
            start += len(stop_text)
        return full.ids(self.tokenizer, start)


class AgentSampler:
    """G trajectories per reset in text environments, on the built-in engine or a conversation ``engine``."""

    def __init__(self, model: nn.Module, tokenizer: Any, renderer: ChatRenderer, limits: TurnLimits,
                 engine: Any = None, compile_steps: bool = False):
        self.model, self.tokenizer, self.renderer, self.limits = model, tokenizer, renderer, limits
        self.compiled = CompiledStep() if compile_steps else None
        self.engine = engine

    @property
    def uses_live_model(self) -> bool:
        return self.engine is None

    def update_weights(self, model: nn.Module) -> None:
        """Follow ``model``: the live module itself, or pushed into the vLLM engine before its next turn."""
        self.model = model
        if self.engine is not None:
            self.engine.update_weights(model)

    def phase(self) -> Any:
        return self.engine.phase() if self.engine is not None else contextlib.nullcontext()

    @property
    def compiles(self) -> bool:
        return self.compiled is not None

    def rest(self) -> None:
        if self.engine is not None:
            self.engine.rest()

    def sample_ahead(self) -> Any:
        return self.engine.sample_ahead() if self.engine is not None else None

    def cancel(self) -> None:
        if self.engine is not None:
            self.engine.cancel()

    def metrics(self) -> dict[str, float]:
        if self.engine is not None:
            return self.engine.metrics()
        return self.compiled.metrics() if self.compiled is not None else {}

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()

    @property
    def pad_token_id(self) -> int:
        return pad_id(self.tokenizer)

    def generate(self, episodes: Sequence[Any], group_size: int, params: SamplingParams, *,
                 seed: int | Sequence[int] | None = None) -> RolloutBatch:
        """Play ``episodes`` (B = P * G, group-major) to their ends; a failed environment ends its trajectory with
        ``error``, and only a batch of failures is an :class:`~grouprl.errors.EnvError`."""
        starts = [ep.start() for ep in episodes]
        groups = len(episodes) // group_size
        # a group's opening: its first reset that worked (they share the seed and the row)
        openings = [next((s for s in starts[p * group_size:(p + 1) * group_size] if s is not None), None)
                    for p in range(groups)]
        live = [p for p in range(groups) if openings[p] is not None]
        if not live:
            raise _all_failed(episodes)
        rows = [p * group_size + j for p in live for j in range(group_size)]
        playing = [episodes[i] for i in rows]
        prompt_rows = [self.renderer.prompt_ids(openings[p]) for p in live]
        self._check_context(prompt_rows, [episodes[p * group_size] for p in live])
        device = model_device(self.model)
        ids, mask = left_pad(prompt_rows, self.pad_token_id, device)
        stop = stop_token_ids(self.tokenizer, params)
        stop_text = {i: self.tokenizer.decode([i], skip_special_tokens=False) for i in stop}
        stop_t = torch.tensor(stop, dtype=torch.long, device=device)

        def respond(rows: list[int], turns: list[list[int]], stopped: list[bool]) -> list[Reply]:
            return self._respond([playing[r] for r in rows], turns,
                                 [stop_text.get(t[-1]) if ended else None for t, ended in zip(turns, stopped)],
                                 set(stop))

        all_seeds = resolve_row_seeds(seed, len(episodes))
        seeds = [all_seeds[i] for i in rows]  # a row draws from its own seed, whichever groups are played

        def decode(model: nn.Module) -> Conversations:
            return decode_conversations(model, ids, mask, group_size, params, self.limits, respond, seeds, stop_t,
                                        self.pad_token_id, self.compiled)

        if self.engine is not None:  # token in, token out through vLLM's prefix cache
            out = self.engine.conversations(prompt_rows, group_size, params, self.limits, respond, seeds, stop)
        else:
            check_format(params.format, device)
            with eval_mode(self.model), torch.inference_mode():
                out = run_in_format(params.format, self.model, decode)
        out = _with_failed_groups(out, rows, len(episodes))
        if all(reason == "error" for reason in out.end_reason):
            raise _all_failed(episodes)
        all_prompts = [prompt_rows[live.index(p)] if p in live else [] for p in range(groups)]
        ids, mask = left_pad(all_prompts, self.pad_token_id, device)
        return self._assemble(episodes, [s or [] for s in starts], ids, mask, group_size, out)

    def _check_context(self, prompt_rows: list[list[int]], episodes: Sequence[Any]) -> None:
        """A first prompt plus the trajectory budget must fit in the model's context: name the reset that does not."""
        context = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        for ids, episode in zip(prompt_rows, episodes):
            if context is not None and len(ids) + self.limits.max_tokens > context:
                raise PromptTooLongError(context_overflow(
                    f"the environment's first prompt for seed {episode.seed}", len(ids), context,
                    "max_trajectory_tokens", self.limits.max_tokens, max(map(len, prompt_rows)),
                    shorten="shorten the environment's first observation or the system prompt"))

    def _respond(self, episodes: list[Any], turns: list[list[int]], stop_texts: list[str | None],
                 stop: set[int]) -> list[Reply]:
        """The environments' answers to one turn of each of ``episodes``, as tokens to append."""
        actions = [self.tokenizer.decode(t[:-1] if t and t[-1] in stop else t, skip_special_tokens=False)
                   for t in turns]
        return [self._reply(episode, new, stop_text)
                for episode, new, stop_text in zip(episodes, respond_all(episodes, actions), stop_texts)]

    def _reply(self, episode: Any, new: list[dict] | None, stop_text: str | None) -> Reply:
        if new is None:
            return Reply(None, episode.end_reason or "env")
        try:
            ids = self.renderer.reply_ids(episode.messages[: len(episode.messages) - len(new)], new, stop_text)
        except Exception as e:  # noqa: BLE001 - messages the template cannot render end this trajectory only
            episode.error, episode.end_reason = f"{episode.name}: its reply could not be rendered: {e}", "error"
            return Reply(None, "error")
        return Reply(None, "template") if ids is None else Reply(ids)

    def _assemble(self, episodes: Sequence[Any], starts: list[list[dict]], prompt_ids: torch.Tensor,
                  prompt_mask: torch.Tensor, group_size: int, out: Conversations) -> RolloutBatch:
        b = len(episodes)
        width = max(1, max(len(t) for t in out.tokens))
        ids = torch.full((b, width), self.pad_token_id, dtype=torch.long)
        policy, seq, logp = torch.zeros(b, width), torch.zeros(b, width), torch.zeros(b, width)
        for i in range(b):
            n = len(out.tokens[i])
            ids[i, :n] = torch.tensor(out.tokens[i], dtype=torch.long)
            policy[i, :n] = torch.tensor(out.from_policy[i], dtype=torch.float32)
            seq[i, :n] = 1.0
            logp[i, :n] = torch.tensor(out.logprobs[i], dtype=torch.float32)
        reasons = [r if r != "env" else (ep.end_reason or "env") for r, ep in zip(out.end_reason, episodes)]
        info = {"turns": list(out.turns), "end_reason": reasons,
                **{k: [getattr(ep, k) for ep in episodes] for k in EPISODE_FACTS}}
        # the question a group answers: the opening's last user message (a few-shot opening asks others first)
        asked = [next((m["content"] for m in reversed(s) if m.get("role") == "user"), "") for s in starts]
        return RolloutBatch(
            prompt_ids=prompt_ids.repeat_interleave(group_size, 0).cpu(),
            prompt_mask=prompt_mask.repeat_interleave(group_size, 0).cpu(),
            completion_ids=ids, completion_mask=policy, sampling_logprobs=logp,
            truncated=torch.tensor([r in ("length", "turns") for r in reasons]),
            completions=[ep.final_answer or "" for ep in episodes], prompts=asked, group_size=group_size,
            pad_token_id=self.pad_token_id, extras={"trajectory": [list(ep.messages) for ep in episodes]},
            sequence_mask=seq, info=info)


def _all_failed(episodes: Sequence[Any]) -> EnvError:
    """The error of a batch no trajectory of which could be played: the first failure, with its seed."""
    first = next((ep.error for ep in episodes if ep.error), "no trajectory could be played")
    return EnvError(f"every one of the {len(episodes)} trajectories of this batch failed, so no batch could be "
                    f"collected; the first: {first}")


def _with_failed_groups(out: Conversations, rows: list[int], total: int) -> Conversations:
    """``out`` (the played ``rows``) widened to ``total`` rows, the others empty and ended by ``error``."""
    if len(rows) == total:
        return out
    full = Conversations(tokens=[[] for _ in range(total)], from_policy=[[] for _ in range(total)],
                         logprobs=[[] for _ in range(total)], turns=[0] * total, end_reason=["error"] * total)
    for k, i in enumerate(rows):
        full.tokens[i], full.from_policy[i], full.logprobs[i] = out.tokens[k], out.from_policy[k], out.logprobs[k]
        full.turns[i], full.end_reason[i] = out.turns[k], out.end_reason[k]
    return full


EPISODE_FACTS = ("return_", "tool_calls", "tool_errors", "success", "state_keys", "step_rewards", "opening")
