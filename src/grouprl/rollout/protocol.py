"""What the trainer may ask of a rollout engine: :class:`RolloutEngine`, :class:`ConversationEngine` (also plays an
agent's turns) and :class:`SamplesAhead` (samples while the trainer updates). An optional capability is a member
with a neutral answer (``sample_ahead`` None, ``cancel`` a no-op), so the trainer never probes.

Shapes: P prompts, G completions per prompt, B = P * G rows, group-major (row ``p*G + g``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

from torch import nn

from grouprl.rollout.turns import Conversations, Reply, TurnLimits
from grouprl.types import RolloutBatch, SamplingParams


@runtime_checkable
class SamplesAhead(Protocol):
    """Weight hand-over driven by a rollout thread sampling ahead; a version is one ``update_weights``."""

    @property
    def version(self) -> int:
        """The hand-overs made so far (0: the weights the engine started with)."""

    @property
    def pushed(self) -> int | None:
        """The version the engine samples with now (None: none pushed yet)."""

    @property
    def pushable(self) -> int:
        """The newest version the next :meth:`sync_weights` can carry."""

    def write_weights(self) -> None:
        """Copy the followed model's weights as its version, once, from the updating thread between updates."""

    def sync_weights(self) -> None:
        """Have the engine sample with the newest written version from now on (a no-op when it does)."""

    def enter_rollout_thread(self) -> None:
        """The calling thread is the rollout thread from now on (its collectives get a process group of their own)."""

    def cancel(self) -> None:
        """Give up the requests in flight (the run is stopping)."""


@runtime_checkable
class RolloutEngine(Protocol):
    """What the trainer asks of any rollout engine."""

    @property
    def uses_live_model(self) -> bool:
        """It samples from the module being trained, not a pushed copy (the trainer gathers sharded weights for it;
        ``rollout_is: auto`` corrects only copies)."""

    @property
    def compiles(self) -> bool:
        """It runs the built-in engine's compiled decode steps (``rollout_compile``)."""

    def generate(self, prompt_ids: list[list[int]], group_size: int, params: SamplingParams, *,
                 seed: int | Sequence[int] | None = None, prompts: list | None = None,
                 extras: dict[str, list] | None = None) -> RolloutBatch:
        """G completions for each of P prompts (``seed``: B row seeds or one base seed; ``prompts``, ``extras``: P
        entries each, repeated to B rows); the agent sampler takes B episodes as ``prompt_ids``."""

    def update_weights(self, model: nn.Module) -> None:
        """Follow ``model``: the next policy version (an engine with a copy gets it before its next rollout)."""

    def phase(self) -> AbstractContextManager[None]:
        """Around a rollout or an evaluation, a copy brought up to date at its start (every process enters together)."""

    def rest(self) -> None:
        """The rollout is in, the update next: the engine may free memory until its next use."""

    def metrics(self) -> dict[str, float]:
        """The engine's own counters since the last call (``time/weight_push``, ``server/<i>/busy``, ...)."""

    def sample_ahead(self) -> SamplesAhead | None:
        """Prepare to sample while the trainer updates (once, every process together); None where it cannot."""

    def cancel(self) -> None:
        """Give up the requests in flight (the run is stopping); nothing where none can be."""

    def close(self) -> None:
        """Release what the engine holds beyond this process's memory (vLLM's process groups, servers, folders)."""


@runtime_checkable
class ConversationEngine(RolloutEngine, Protocol):
    """An engine that also plays multi-turn trajectories, token in, token out (vLLM, rollout servers)."""

    def conversations(self, prompt_rows: list[list[int]], group_size: int, params: SamplingParams,
                      limits: TurnLimits, respond: Callable[[list[int], list[list[int]], list[bool]], list[Reply]],
                      seeds: list[int], stop_ids: list[int]) -> Conversations:
        """As :func:`grouprl.rollout.turns.decode_conversations`, each turn answered by ``respond``."""


def declared(*protocols: type) -> frozenset[str]:
    """The member names ``protocols`` declare (what a caller may ask of an object implementing them)."""
    names: set[str] = set()
    for protocol in protocols:
        for cls in protocol.__mro__:
            if cls is not object and cls is not Protocol and getattr(cls, "_is_protocol", False):
                names.update(n for n in vars(cls) if not n.startswith("_"))
    return frozenset(names)


ENGINE_MEMBERS = declared(RolloutEngine)
AHEAD_MEMBERS = declared(SamplesAhead)
