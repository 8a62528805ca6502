"""A step's experience from the user's own agent: ``agent(client, row)`` runs G times per task row, each copy with
an OpenAI client keyed to its trajectory on the run's chat endpoint. A call whose prompt ids extend the previous
call's prompt and completion continues one sequence (the tokens between are context); one that does not starts
another sample of the trajectory, with the same reward. An agent that raises, times out or never calls the model
is dropped (its group one smaller); only a batch of failures stops the run.

Shapes: P task rows, G trajectories each, B rows (a trajectory's samples), T tokens after each prompt."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import secrets
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from grouprl.errors import EnvError
from grouprl.rewards import score_rewards
from grouprl.rewards.base import combine, unique_names
from grouprl.rewards.remote import mark_unscored
from grouprl.rollout.runner import left_pad
from grouprl.run.logs import PhaseTimer
from grouprl.run.seed_streams import PromptStream, mix_seed
from grouprl.trainer.chat_endpoint import Call, ChatEndpoint
from grouprl.trainer.collect import Collected, factorize
from grouprl.types import RolloutBatch

if TYPE_CHECKING:
    from grouprl.trainer.config import TrainerConfig


@dataclass
class Trajectory:
    row: int
    calls: list[Call] = field(default_factory=list)
    reward: float | None = None
    failure: str | None = None


@dataclass
class Sample:
    """A trajectory's one sequence: its first prompt, then tokens that are the policy's or context."""

    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    from_policy: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    def add(self, ids: Sequence[int], logprobs: Sequence[float] | None) -> None:
        self.tokens += ids
        self.from_policy += [logprobs is not None] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)


def samples(calls: Sequence[Call]) -> list[Sample]:
    """The sequences ``calls`` make: a new one wherever a prompt does not extend the last, token for token."""
    out: list[Sample] = []
    for call in calls:
        so_far = out[-1].prompt + out[-1].tokens if out else None
        if so_far is not None and call.prompt_ids[:len(so_far)] == so_far:
            out[-1].add(call.prompt_ids[len(so_far):], None)  # the tool results, the next user turn: context
        else:
            out.append(Sample(list(call.prompt_ids)))
        out[-1].add(call.completion_ids, call.logprobs)
    return out


class AgentCollector:
    """Runs ``agent`` (async, or a function run in a thread) against ``endpoint``; None rewards are the functions'."""

    def __init__(self, endpoint: ChatEndpoint, agent: Callable[..., Any], rows: Sequence[dict[str, Any]],
                 reward_fns: Sequence[Callable], reward_weights: Sequence[float], config: TrainerConfig,
                 share: Callable[[int], tuple[int, int]], pad_token_id: int):
        self.endpoint, self.agent, self.rows = endpoint, agent, list(rows)
        self.reward_fns, self.reward_weights = list(reward_fns), list(reward_weights)
        self.config, self.share, self.pad = config, share, pad_token_id
        self.stream = PromptStream(len(self.rows), config.seed)

    def collect(self, step: int, timer: PhaseTimer) -> Collected:
        c = self.config
        idx = self.stream.take(c.prompts_per_step)  # every process advances the stream by the whole batch
        first, stop = self.share(len(idx))
        rows = [self.rows[i] for i in idx[first:stop]]
        self.endpoint.seed = mix_seed(c.seed, step, first) % 2**31
        with timer("rollout"):
            played = self.play(rows, c.group_size)
        kept = [t for t in played if t.failure is None]
        for t in played:
            if t.failure is not None:
                warnings.warn(f"agent trajectory dropped (task row {idx[first + t.row]}): {t.failure}", stacklevel=2)
        if not kept:
            raise EnvError(f"every one of the {len(played)} agent trajectories of this batch failed; the first: "
                           f"{played[0].failure}")
        parts = [samples(t.calls) for t in kept]
        batch = self.assemble(kept, parts, rows)
        with timer("reward"):
            total, per_fn, lost = self.score(kept, rows, batch)
        metrics = {**lost, "agent/dropped": float(len(played) - len(kept)),
                   "agent/split_share": sum(len(p) > 1 for p in parts) / len(parts),
                   "agent/calls_mean": sum(len(t.calls) for t in kept) / len(kept)}
        return Collected(batch=batch, rewards=total, per_fn=per_fn, rounds=1, metrics=metrics)

    def rewarded(self, rows: Sequence[dict[str, Any]], k: int) -> torch.Tensor:
        """``[n]`` rewards of ``k`` runs on each of ``rows`` (the n that were not dropped)."""
        kept = [t for t in self.play(rows, k) if t.failure is None]
        if not kept:
            return torch.tensor([math.nan])
        batch = self.assemble(kept, [samples(t.calls) for t in kept], rows)
        heads = [batch.info["trajectory_index"].index(j) for j in range(len(kept))]
        return self.score(kept, rows, batch)[0][heads]

    def play(self, rows: Sequence[dict[str, Any]], group_size: int) -> list[Trajectory]:
        trajectories = [Trajectory(p) for p in range(len(rows)) for _ in range(group_size)]
        with self.endpoint.serving():
            asyncio.run(self._play_all(trajectories, rows))
        return trajectories

    async def _play_all(self, trajectories: list[Trajectory], rows: Sequence[dict[str, Any]]) -> None:
        await asyncio.gather(*(self._play(t, dict(rows[t.row])) for t in trajectories))

    async def _play(self, t: Trajectory, row: dict[str, Any]) -> None:
        import openai

        key = f"grouprl-{secrets.token_hex(16)}"
        self.endpoint.open(key)
        timeout = self.config.agent_timeout
        try:
            if inspect.iscoroutinefunction(self.agent):
                async with openai.AsyncOpenAI(base_url=self.endpoint.base_url, api_key=key, max_retries=0) as client:
                    result = await asyncio.wait_for(self.agent(client, row), timeout)
            else:
                client = openai.OpenAI(base_url=self.endpoint.base_url, api_key=key, max_retries=0)
                result = await asyncio.wait_for(_in_thread(self.agent, client, row), timeout)
            t.reward = _reward(result)
        except TimeoutError:
            t.failure = f"the agent ran past agent_timeout ({timeout:g} s)"
        except Exception as e:  # noqa: BLE001 - the agent is the user's code: its failure drops its trajectory only
            t.failure = f"the agent raised {type(e).__name__}: {e}"
        t.calls = self.endpoint.take(key)
        if t.failure is None and not t.calls:
            t.failure = "the agent never called the model"

    def assemble(self, kept: list[Trajectory], parts: list[list[Sample]], rows: Sequence[dict]) -> RolloutBatch:
        """One row per sample; a trajectory's samples share its group and its ``info["trajectory_index"]``."""
        flat = [(k, s) for k, ps in enumerate(parts) for s in ps]
        width = max(1, max(len(s.tokens) for _, s in flat))
        ids = torch.full((len(flat), width), self.pad, dtype=torch.long)
        policy, seq, logp = (torch.zeros(len(flat), width) for _ in range(3))
        for i, (_, s) in enumerate(flat):
            n = len(s.tokens)
            ids[i, :n] = torch.tensor(s.tokens, dtype=torch.long)
            policy[i, :n] = torch.tensor(s.from_policy, dtype=torch.float32)
            seq[i, :n] = 1.0
            logp[i, :n] = torch.tensor(s.logprobs, dtype=torch.float32)
        prompt_ids, prompt_mask = left_pad([s.prompt for _, s in flat], self.pad, torch.device("cpu"))
        by = self.config.group_by
        keys = [rows[kept[k].row][by] if by is not None else kept[k].row for k, _ in flat]
        messages = [kept[k].calls[-1].messages for k, _ in flat]
        return RolloutBatch(
            prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=ids, completion_mask=policy,
            sampling_logprobs=logp, truncated=torch.tensor([kept[k].calls[-1].truncated for k, _ in flat]),
            completions=[m[-1]["content"] for m in messages], prompts=[kept[k].calls[0].messages[:-1] for k, _ in flat],
            group_size=self.config.group_size, pad_token_id=self.pad, extras={"trajectory": messages},
            sequence_mask=seq, group_ids=factorize(keys),
            info={"trajectory_index": [k for k, _ in flat], "turns": [len(kept[k].calls) for k, _ in flat],
                  "end_reason": ["length" if kept[k].calls[-1].truncated else "stop" for k, _ in flat],
                  "success": [None] * len(flat), "opening": [len(kept[k].calls[0].messages) - 1 for k, _ in flat]})

    def score(self, kept: list[Trajectory], rows: Sequence[dict],
              batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, float]]:
        """``[B]`` rewards: the agent's where it returned one, else the reward functions' on its last answer (NaN
        where a reward service left it unscored); per function; ``reward/remote_failed`` with a reward service."""
        of = batch.info["trajectory_index"]
        agent = torch.tensor([math.nan if kept[k].reward is None else kept[k].reward for k in of], dtype=torch.float32)
        unscored = [k for k, t in enumerate(kept) if t.reward is None]
        if not unscored:
            return agent, {"agent": agent}, {}
        if not self.reward_fns:
            raise EnvError("the agent returned None (score my last answer) but the run has no reward_functions")
        ends = [kept[k].calls[-1].messages for k in unscored]
        answers = [m[-1]["content"] for m in ends]
        columns = {c: [rows[kept[k].row].get(c) for k in unscored] for c in rows[0]}
        scores = score_rewards(self.reward_fns, self.reward_weights, [m[:-1] for m in ends], answers,
                               [kept[k].calls[-1].completion_ids for k in unscored],
                               {**columns, "trajectory": ends})
        marked, failed = mark_unscored(self.reward_fns, None, None, scores.total, answers)
        lost = torch.zeros(len(kept), dtype=torch.bool)
        lost[unscored] = marked.isnan() & ~scores.total.isnan()
        per_fn = {"agent": agent}
        for name, values in scores.per_fn.items():
            full = torch.full((len(kept),), math.nan)
            full[unscored] = values
            per_fn[name] = full[of]
        weights = {"agent": 1.0, **dict(zip(unique_names(self.reward_fns), self.reward_weights))}
        fn_total = combine({k: v for k, v in per_fn.items() if k != "agent"}, weights)
        fn_total = torch.where(lost[of], torch.full_like(fn_total, math.nan), fn_total)
        return torch.where(agent.isnan(), fn_total, agent), per_fn, failed


def _in_thread(fn: Callable[..., Any], client: Any, row: dict[str, Any]) -> asyncio.Future:
    """``fn(client, row)`` in a daemon thread, so one that hangs holds up neither the run nor its exit."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if not done.done():
            done.set_result(result) if error is None else done.set_exception(error)

    def run() -> None:
        result, error = None, None
        try:
            with client:
                result = fn(client, row)
        except Exception as e:  # noqa: BLE001 - handed to the awaiting trajectory
            error = e
        with contextlib.suppress(RuntimeError):  # the loop is gone: the trajectory timed out long ago
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, daemon=True).start()
    return done


def _reward(result: Any) -> float | None:
    """What the agent returned, as a reward; a TypeError naming it otherwise."""
    if result is None or (isinstance(result, (int, float)) and not isinstance(result, bool)):
        return None if result is None else float(result)
    raise TypeError(f"it returned a {type(result).__name__}; an agent returns a float reward or None")
