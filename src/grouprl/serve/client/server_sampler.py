""":class:`ServerSampler`, a rollout engine whose completions come from ``grouprl serve`` processes: the G rows of a
group go to one server (its prompt prefilled once), groups round-robin; each row carries its own seed, so a completion
does not depend on which server drew it. Agents: each turn sends every trajectory's tokens to its group's server."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from grouprl.rollout.sampler import check_params
from grouprl.rollout.seeds import resolve_row_seeds
from grouprl.rollout.stops import stop_token_ids
from grouprl.rollout.turns import Conversations, Reply, TurnLimits
from grouprl.rollout.vllm_convert import outputs_to_batch, play_conversations, vllm_sampling_kwargs
from grouprl.serve.client.handover import WeightHandover
from grouprl.serve.client.pool import ServerPool
from grouprl.serve.client.ranks import Ranks
from grouprl.serve.client.servers import RolloutServerError, Server, ServerFailure
from grouprl.serve.server.guard import TOKEN_ENV
from grouprl.types import RolloutBatch, SamplingParams

GENERATE = "/inference/v1/generate"


@dataclass(frozen=True)
class Logprob:  # shaped as vLLM's, for outputs_to_batch
    logprob: float


@dataclass(frozen=True)
class Completion:
    """One row's completion as a server returned it (the fields :func:`outputs_to_batch` reads)."""

    token_ids: list[int]
    logprobs: list[dict[int, Logprob]]
    finish_reason: str
    version: int | None  # the oldest policy version that drew its tokens (None: before any push)


def parse_completion(answer: dict[str, Any], address: str) -> Completion:
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


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class ServerSampler:
    """Rollouts from ``grouprl serve`` servers (host:port each) for ``model`` (plain or peft LoRA). ``timeout``: seconds
    a request may take before its server is dropped; ``weights_dir``: where the files transport writes (None:
    /dev/shm, else the temporary folder); ``local``: servers started here
    (:class:`~grouprl.trainer.local_servers.LocalServers`); ``down``: servers known not to have come up
    (host:port -> why); ``token``: None for ``GROUPRL_SERVER_TOKEN``."""

    uses_live_model = False  # the servers hold copies of the weights
    compiles = False

    def __init__(self, model: nn.Module, tokenizer: Any, servers: Sequence[str], *, timeout: float = 300.0,
                 weights_dir: str | None = None, local: Any = None, transport: str = "files",
                 down: dict[str, str] | None = None, token: str | None = None):
        self.ranks = Ranks.current()  # several trainer processes: process 0 alone pushes
        self.tokenizer, self.local = tokenizer, local
        self.lora = hasattr(model, "peft_config")
        self.pool = ServerPool(servers, timeout, token=token if token is not None else os.environ.get(TOKEN_ENV))
        self.handover: WeightHandover | None = None
        self.lag = 0
        for server in self.pool.servers:  # found down already (by process 0, for its local servers)
            if server.address in (down or {}):
                self.pool.drop(ServerFailure(server, down[server.address]))
        if local is not None:
            for i, server in enumerate(self.pool.servers):
                server.describe_exit = lambda settle, i=i: local.describe(i, settle)
                server.stop = lambda i=i: local.kill(i)
        try:
            self.pool.run(self.pool.wait_ready())
            self._check_servers(model)
            self.handover = WeightHandover(model, self.pool, transport, ranks=self.ranks, dtype=self.dtype,
                                           lora=self.lora, timeout=timeout, weights_dir=weights_dir)
        except BaseException:
            self.close()
            raise

    def _check_servers(self, model: nn.Module) -> None:
        """Each server serves a model of the policy's shape, in one number format, or an error naming it."""
        inner = model.get_base_model() if self.lora else model
        config = inner.config.get_text_config() if hasattr(inner.config, "get_text_config") else inner.config
        mine = {"vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
                "num_hidden_layers": config.num_hidden_layers}
        for s in self.pool.alive:
            facts = s.info.get("facts", {})
            wrong = {k: (facts.get(k), v) for k, v in mine.items() if facts.get(k) != v}
            if wrong:
                said = ", ".join(f"{k} {a} there, {b} here" for k, (a, b) in wrong.items())
                raise RolloutServerError(f"rollout server {s.address} serves {s.info.get('model')}, not the policy's "
                                         f"shape: {said}")
        formats = {s.info.get("dtype") for s in self.pool.alive}
        if len(formats) > 1:
            said = ", ".join(map(str, formats))
            raise RolloutServerError(f"the rollout servers sample in different formats ({said}): start them all "
                                     "with one --dtype")
        self.dtype = DTYPES.get(formats.pop(), torch.float32)
        self.max_model_len = min(int(s.info.get("max_model_len", 0)) for s in self.pool.alive)

    # -- the engine protocol (grouprl.rollout.protocol) ----------------------------------------------
    def update_weights(self, model: nn.Module) -> None:
        self.handover.follow(model)

    def sync_weights(self) -> None:
        self.handover.sync_weights()

    def sample_ahead(self) -> WeightHandover:
        return self.handover.sample_ahead()

    def cancel(self) -> None:
        self.pool.cancel()

    def rest(self) -> None:
        """Nothing to free: the servers hold the weights."""

    @contextlib.contextmanager
    def phase(self) -> Iterator[None]:
        self.sync_weights()
        yield

    def metrics(self) -> dict[str, float]:
        """Since the last call: weight sync and write seconds, busy shares; the last rollout's policy lag."""
        sync, write = self.handover.take_seconds()
        return {"time/weight_sync": sync, "time/weight_write": write, "rollout/policy_lag": float(self.lag),
                "rollout/servers": float(len(self.pool.alive)),
                **{f"server/{i}/busy": share for i, share in enumerate(self.pool.busy_shares())}}

    def close(self) -> None:
        if self.handover is not None:
            self.handover.close()
        self.pool.close()
        if self.local is not None:
            self.local.stop()

    # -- generation ---------------------------------------------------------------------------------
    def _check_lengths(self, sequences: Sequence[Sequence[int]], budget: Sequence[int]) -> None:
        for i, (ids, n) in enumerate(zip(sequences, budget)):
            if not ids:
                raise ValueError(f"prompt {i} has no tokens")
            if len(ids) + n > self.max_model_len:
                raise ValueError(f"prompt {i} has {len(ids)} tokens; with {n} new ones that is over the rollout "
                                 f"servers' max_model_len of {self.max_model_len}")

    async def _complete(self, sequences: list[list[int]], kwargs: list[dict[str, Any]],
                        groups: list[int]) -> list[Completion]:
        async def one(server: Server, i: int) -> Completion:
            body = {"token_ids": sequences[i], "sampling_params": kwargs[i], "output_mode": "tokens"}
            if self.lora and server.adapter is not None:  # a plain policy samples from the base weights
                body["model"] = server.adapter
            return parse_completion(await self.pool.request(server, "POST", GENERATE, body), server.address)

        return await self.pool.spread(one, len(sequences), groups)

    def complete(self, sequences: list[list[int]], kwargs: list[dict[str, Any]],
                 groups: list[int]) -> concurrent.futures.Future:
        """A future of one completion per sequence (row ``i`` on the server of group ``groups[i]``)."""
        self._check_lengths(sequences, [k["max_tokens"] for k in kwargs])
        if self.ranks is None:
            self.handover.sync_weights()
        else:  # the push is a collective, made at the start of the rollout (phase) or of a batch sampled ahead
            self.handover.check_pushed()
            groups = self.ranks.route(groups)
        return self.pool.submit(self._complete(sequences, kwargs, groups))

    def _record_lag(self, completions: Sequence[Completion]) -> list[int | None]:
        versions = [c.version for c in completions]
        known = [v for v in versions if v is not None]
        self.lag = max((self.handover.version - v for v in known), default=0)
        return versions

    def submit(self, prompt_ids: list[list[int]], group_size: int, params: SamplingParams, *,
               seed: int | Sequence[int] | None = None, prompts: list | None = None,
               extras: dict[str, list] | None = None) -> PendingBatch:
        """:meth:`generate`, not waited for: its batch is ``.result()``."""
        check_params(params)
        seeds = resolve_row_seeds(seed, len(prompt_ids) * group_size)
        stop = stop_token_ids(self.tokenizer, params)
        rows = [list(map(int, ids)) for ids in prompt_ids for _ in range(group_size)]
        kwargs = [vllm_sampling_kwargs(params, stop, s) for s in seeds]
        done = self.complete(rows, kwargs, [r // group_size for r in range(len(rows))])
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id

        def assemble(completions: list[Completion]) -> RolloutBatch:
            batch = outputs_to_batch(completions, prompt_ids, group_size, self.tokenizer, int(pad or 0),
                                     tuple(params.stop_strings), prompts, extras)
            batch.info["policy_version"] = self._record_lag(completions)
            return batch

        return PendingBatch(done, assemble)

    def generate(self, prompt_ids: list[list[int]], group_size: int, params: SamplingParams, *,
                 seed: int | Sequence[int] | None = None, prompts: list | None = None,
                 extras: dict[str, list] | None = None) -> RolloutBatch:
        """G completions for each of P prompts, prompt-major (B = P*G rows), as the built-in sampler's."""
        return self.submit(prompt_ids, group_size, params, seed=seed, prompts=prompts, extras=extras).result()

    def conversations(self, prompt_rows: list[list[int]], group_size: int, params: SamplingParams,
                      limits: TurnLimits, respond: Callable[[list[int], list[list[int]], list[bool]], list[Reply]],
                      seeds: list[int], stop_ids: list[int]) -> Conversations:
        """Multi-turn trajectories, G per initial prompt (rows group-major), as ``decode_conversations``'s."""
        versions: list[Any] = []

        def complete(rows: list[int], sequences: list[list[int]], kwargs: list[dict]) -> list[Any]:
            got = self.complete(sequences, kwargs, [r // group_size for r in rows]).result()  # a group to a server
            versions.extend(got)
            return got

        out = play_conversations(prompt_rows, group_size, params, limits, respond, seeds, stop_ids, complete)
        self._record_lag(versions)
        return out
