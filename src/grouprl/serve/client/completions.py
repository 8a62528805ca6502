"""A rollout server's completions as the trainer reads them (:class:`Completion`, one a row) and
:class:`PendingBatch`, a rollout in flight."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grouprl.serve.client.servers import RolloutServerError
from grouprl.types import RolloutBatch

GENERATE = "/inference/v1/generate"


@dataclass(frozen=True)
class Logprob:
    """One sampled token's log-prob, shaped as vLLM's ``Logprob`` for :func:`outputs_to_batch`."""

    logprob: float


@dataclass(frozen=True)
class Completion:
    """One row's completion as a server returned it (the fields :func:`outputs_to_batch` reads)."""

    token_ids: list[int]
    logprobs: list[dict[int, Logprob]]
    finish_reason: str
    version: int | None
    """The oldest policy version that drew its tokens (None: before any push)."""


def parse_completion(answer: dict[str, Any], address: str) -> Completion:
    """A :class:`Completion` from vLLM's ``/inference/v1/generate`` answer (``n`` = 1)."""
    try:
        choice = answer["choices"][0]
        ids = [int(t) for t in choice["token_ids"]]
        lps = [float(e["logprob"]) for e in (choice.get("logprobs") or {}).get("content") or []]
        spans = choice.get("weight_versions") or []
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise RolloutServerError(f"rollout server {address} answered {GENERATE} in an unknown shape "
                                 f"({type(e).__name__}: {e}): {str(answer)[:300]}") from e
    if len(lps) != len(ids):
        raise RolloutServerError(f"rollout server {address} returned {len(ids)} tokens with {len(lps)} log-probs")
    versions = [int(s["version"]) for s in spans if str(s.get("version", "")).lstrip("-").isdigit()]
    return Completion(ids, [{t: Logprob(lp)} for t, lp in zip(ids, lps)], choice.get("finish_reason") or "stop",
                      min(versions) if versions else None)


@dataclass
class PendingBatch:
    """A rollout in flight: completions arrive on the pool's loop, the batch is assembled in the caller's thread."""

    completions: concurrent.futures.Future
    assemble: Callable[[list[Completion]], RolloutBatch]

    def done(self) -> bool:
        return self.completions.done()

    def result(self) -> RolloutBatch:
        return self.assemble(self.completions.result())
