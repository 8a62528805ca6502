"""Rewards and group judges behind HTTP (docs/remote-rewards.md): a reward function given as a URL POSTs batches of
rows and reads one score per row; a judge given as a URL POSTs each group and reads one score per member.

A service that cannot be reached, times out or answers 5xx/429 is retried with exponential backoff; after the
retries its rows get no reward (NaN: no advantage) and are counted in ``reward/remote_failed``, so a failing service
never stops or hangs a run. A 4xx answer, a wrong number of scores or a score that is no number is the request's or
the service's fault and stops the run with the service's message.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import warnings
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx
import torch

from grouprl.errors import ConfigError, RewardFunctionError
from grouprl.rewards.base import _await_all
from grouprl.rewards.judges import JUDGES, JudgeGroup

TOKEN_ENV = "GROUPRL_REWARD_TOKEN"
MAX_IN_FLIGHT = 8
"""Requests of one step a scorer has open at once; the rest wait their turn."""
BACKOFF_S = 0.5
"""Wait before the first retry; doubled before each further one."""


def is_url(spec: str) -> bool:
    """Whether a ``reward_functions`` entry or a ``judge`` names a service rather than a function."""
    return spec.startswith(("http://", "https://"))


def url_problem(url: str) -> str | None:
    """What is wrong with ``url`` as a service address, or None.

    >>> url_problem("http://127.0.0.1:8000/score") is None, url_problem("http://:80/score")
    (True, "'http://:80/score' names no host")
    """
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is no number or out of range
    except ValueError as e:
        return f"{url!r} is not a URL: {e}"
    if parts.scheme not in ("http", "https") or any(c.isspace() for c in url):
        return f"{url!r} is not an http:// or https:// URL"
    return None if parts.hostname else f"{url!r} names no host"


def settings_problems(batch_size: int, timeout: float, retries: int) -> list[str]:
    """What is wrong with the ``remote_reward_*`` settings."""
    return [f"{key}={value} must be {rule}" for key, value, ok, rule in (
        ("remote_reward_batch_size", batch_size, batch_size >= 1, ">= 1"),
        ("remote_reward_timeout", timeout, math.isfinite(timeout) and timeout > 0, "a positive number of seconds"),
        ("remote_reward_retries", retries, retries >= 0, ">= 0")) if not ok]


def remote_problems(config: Any) -> list[str]:
    """What is wrong with a run config's reward services (its URLs and ``remote_reward_*`` keys)."""
    urls = [u for u in [*config.reward_functions, config.judge or ""] if is_url(u)]
    out = [f"{'judge' if u == config.judge else 'reward_functions'}: {p}" for u in urls if (p := url_problem(u))]
    out += [f"reward_options for {u!r}: a reward service takes no options" for u in urls if u in config.reward_options]
    if urls:
        out += settings_problems(config.remote_reward_batch_size, config.remote_reward_timeout,
                                 config.remote_reward_retries)
    return out


def remote_settings(config: Any) -> dict[str, Any]:
    """A run config's ``remote_reward_*`` keys as the options of a :class:`RemoteReward` or :class:`RemoteJudge`."""
    return {"token": config.remote_reward_token, "timeout": config.remote_reward_timeout,
            "retries": config.remote_reward_retries}


class Unanswered(Exception):
    """A request that failed after every retry."""


class Service:
    """POSTs JSON to one URL with a bearer token: at most :data:`MAX_IN_FLIGHT` requests open, each retried
    ``retries`` times with backoff on connection errors, timeouts, 5xx and 429."""

    def __init__(self, url: str, token: str | None, timeout: float, retries: int, batch_size: int = 1):
        problems = [p for p in [url_problem(url), *settings_problems(batch_size, timeout, retries)] if p]
        if problems:
            raise ConfigError("; ".join(problems))
        self.url, self.timeout, self.retries = url, float(timeout), int(retries)
        self.token = token if token is not None else os.environ.get(TOKEN_ENV)
        self.name = url.partition("://")[2].partition("?")[0].rpartition("@")[2]
        self.shown = f"{url.partition('://')[0]}://{self.name}"  # in messages: no credentials of the URL's own

    async def post_many(self, payloads: list[dict[str, Any]]) -> list[Any]:
        """Each payload's ``scores`` answer, or an :class:`Unanswered` in its place; all sent concurrently."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        limit = asyncio.Semaphore(MAX_IN_FLIGHT)
        async with httpx.AsyncClient(timeout=self.timeout, headers=headers) as client:
            return await asyncio.gather(*(self._post(client, limit, p) for p in payloads))

    def post_all(self, payloads: list[dict[str, Any]]) -> list[Any]:
        """:meth:`post_many` from synchronous code."""
        result = _await_all([self.post_many(payloads)])[0]
        if isinstance(result, BaseException):
            raise result
        return result

    async def _post(self, client: httpx.AsyncClient, limit: asyncio.Semaphore, payload: dict[str, Any]) -> Any:
        error = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(BACKOFF_S * 2 ** (attempt - 1))
            async with limit:
                try:
                    response = await client.post(self.url, json=payload)
                except httpx.TransportError as e:  # refused, reset, timed out
                    error = f"{type(e).__name__}: {e}"
                    continue
            if response.status_code == 429 or response.status_code >= 500:
                error = f"HTTP {response.status_code}: {response.text[:200]}"
                continue
            if response.status_code >= 400:
                raise RewardFunctionError(self.shown, f"refused the request: HTTP {response.status_code}: "
                                                    f"{response.text[:500]}")
            try:
                return response.json()["scores"]
            except (ValueError, KeyError, TypeError) as e:
                raise RewardFunctionError(self.shown, f'answered {response.text[:200]!r}; expected JSON '
                                                    f'{{"scores": [...]}}') from e
        return Unanswered(f"{error} (after {self.retries} retries)")

    def checked(self, scores: Any, count: int, first: int, group: int | None = None) -> list[float | None]:
        """``scores`` as ``count`` floats (None allowed for rows, not for a judged ``group``'s members), else an
        error naming the URL and the row (``first`` is the batch's first row)."""
        of = f"group {group}" if group is not None else f"rows {first}-{first + count - 1}"
        if not isinstance(scores, list) or len(scores) != count:
            got = f"{len(scores)} scores" if isinstance(scores, list) else repr(scores)[:100]
            raise RewardFunctionError(self.shown, f"answered {got} for {count} rows ({of})")
        for i, s in enumerate(scores):
            number = isinstance(s, int | float) and not isinstance(s, bool) and math.isfinite(s)
            if not (number or (s is None and group is None)):
                raise RewardFunctionError(self.shown, f"answered {s!r} for row {first + i} ({of}); a score is a "
                                                    f"finite number{' or null' if group is None else ''}")
        return [None if s is None else float(s) for s in scores]

    def warn(self, errors: list[Unanswered], failed: int, total: int, what: str) -> None:
        if not errors:
            return
        everything = "EVERY ONE" if failed == total else f"{failed}"
        warnings.warn(f"{self.shown}: {everything} of the {total} {what} got no score "
                      f"({len(errors)} request(s) failed; the first: {errors[0]})", RuntimeWarning, stacklevel=3)


def _sendable(key: str, value: Any) -> bool:
    """Whether a column can be sent as JSON (token ids stay home: they mean nothing without the tokenizer)."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return key != "completion_ids"


class RemoteReward:
    """A reward function served at ``url``: rows go in batches of ``batch_size`` as
    ``{"prompts": [...], "completions": [...], "columns": {name: [...]}}`` and come back as ``{"scores": [...]}``,
    a float or null per row. :meth:`unanswered` tells which rows of a call went unanswered."""

    def __init__(self, url: str, token: str | None = None, batch_size: int = 64, timeout: float = 60.0,
                 retries: int = 3):
        self.service = Service(url, token, timeout, retries, batch_size)
        self.name, self.batch_size = self.service.name, batch_size
        self._unanswered: dict[int, list[bool]] = {}  # hash of a call's completions -> its rows unanswered

    def payloads(self, prompts: list[Any], completions: list[str], columns: dict[str, Any]) -> list[dict[str, Any]]:
        """The requests that score these rows: batches of at most ``batch_size``."""
        columns = {k: list(v) for k, v in columns.items() if _sendable(k, list(v))}
        return [{"prompts": prompts[s:s + self.batch_size], "completions": completions[s:s + self.batch_size],
                 "columns": {k: v[s:s + self.batch_size] for k, v in columns.items()}}
                for s in range(0, len(completions), self.batch_size)]

    async def __call__(self, prompts: list[Any], completions: list[str], **columns: Any) -> list[float | None]:
        payloads = self.payloads(prompts, completions, columns)
        starts = range(0, len(completions), self.batch_size)
        answers = await self.service.post_many(payloads)
        scores: list[float | None] = []
        failed: list[bool] = []
        for start, payload, answer in zip(starts, payloads, answers):
            count = len(payload["completions"])
            unanswered = isinstance(answer, Unanswered)
            scores += [None] * count if unanswered else self.service.checked(answer, count, start)
            failed += [unanswered] * count
        self.service.warn([a for a in answers if isinstance(a, Unanswered)], sum(failed), len(completions), "rows")
        # Keyed by the rows, not kept as "the last call's": evaluation may call it while a rollout thread scores.
        self._unanswered[hash(tuple(completions))] = failed
        while len(self._unanswered) > MAX_IN_FLIGHT:
            self._unanswered.pop(next(iter(self._unanswered)))
        return scores

    def unanswered(self, completions: Sequence[str]) -> list[bool]:
        """Whether each row of the call on ``completions`` went unanswered (asked once, after the call)."""
        return self._unanswered.pop(hash(tuple(completions)), [False] * len(completions))


class RemoteJudge:
    """A group judge served at ``url``: each group goes as ``{"prompt": ..., "completions": [G], "columns": {...}}``
    and comes back as ``{"scores": [G numbers]}`` or ``{"scores": null}`` (the group dropped). ``failed_groups``: the
    indices of the last call's groups that went unanswered."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 60.0, retries: int = 3):
        self.service = Service(url, token, timeout, retries)
        self.__name__ = self.service.name
        self.failed_groups: list[int] = []

    @staticmethod
    def payload(group: JudgeGroup) -> dict[str, Any]:
        return {"prompt": group.prompt, "completions": list(group.completions),
                "columns": {k: v for k, v in group.columns.items() if _sendable(k, v)}}

    def judge_groups(self, groups: list[JudgeGroup]) -> list[list[float] | None]:
        answers = self.service.post_all([self.payload(g) for g in groups])
        errors = [a for a in answers if isinstance(a, Unanswered)]
        self.failed_groups = [i for i, a in enumerate(answers) if isinstance(a, Unanswered)]
        self.service.warn(errors, len(errors), len(groups), "groups")
        return [None if a is None or isinstance(a, Unanswered) else self.service.checked(a, len(g.completions), 0, i)
                for i, (g, a) in enumerate(zip(groups, answers))]


def _judge(scheme: str):
    return lambda rest, load_model, **options: RemoteJudge(f"{scheme}:{rest}", **options)


JUDGES.register("http", _judge("http"))
JUDGES.register("https", _judge("https"))


def mark_unscored(reward_fns: Sequence[Any], judge: Any, judge_weight: float | None, total: torch.Tensor | None,
                  completions: Sequence[str], group_index: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor | None, dict[str, float]]:
    """After a round's ``completions`` are scored: rows a remote reward function left unscored get a NaN total (no
    advantage) where the reward functions count toward it, and ``reward/remote_failed`` counts the rows left
    unscored by a reward service or in a group a judge service left unjudged (``group_index [B]``: each row's group,
    as the judge was given them), each row once. No metric when nothing is remote."""
    remote = [f for f in reward_fns if isinstance(f, RemoteReward)]
    if not remote and not isinstance(judge, RemoteJudge):
        return total, {}
    failed = torch.zeros(len(completions), dtype=torch.bool)
    if isinstance(judge, RemoteJudge) and judge.failed_groups and group_index is not None:
        failed |= torch.isin(group_index, torch.tensor(judge.failed_groups))
    if remote and total is not None:
        unscored = torch.tensor([any(r) for r in zip(*(fn.unanswered(completions) for fn in remote))],
                                dtype=torch.bool)
        if judge is None or judge_weight is not None:
            total = torch.where(unscored, torch.full_like(total, math.nan), total)
        failed |= unscored
    return total, {"reward/remote_failed": float(failed.sum())}


def probe(reward_fns: Sequence[Any], judge: Any, row: dict[str, Any]) -> None:
    """Before the model loads, each service scores ``row`` (a training row) with empty completions, so a refused
    token or an answer of the wrong shape fails in seconds; one that does not answer yet is only warned of."""
    prompt, columns = row["prompt"], {k: v for k, v in row.items() if k != "prompt"}
    for scorer in [*reward_fns, judge]:
        if isinstance(scorer, RemoteReward):
            payload, group = scorer.payloads([prompt], [""], {k: [v] for k, v in columns.items()})[0], None
        elif isinstance(scorer, RemoteJudge):
            payload, group = scorer.payload(JudgeGroup(prompt, ["", ""], columns)), 0
        else:
            continue
        [answer] = scorer.service.post_all([payload])
        if isinstance(answer, Unanswered):
            warnings.warn(f"{scorer.service.shown} does not answer at the start ({answer}); the run goes on, and each "
                          "step tries again", RuntimeWarning, stacklevel=2)
        elif answer is not None or group is None:
            scorer.service.checked(answer, len(payload["completions"]), 0, group)
