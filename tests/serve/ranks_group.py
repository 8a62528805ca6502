"""A GRPO run through rollout servers in one process or in each of a torchrun-like group of processes (spawned by
:mod:`tests.serve.test_ranks`, DDP on gloo), recording what each process saw: the policy version of every row it
trained on, whether it could push weights, the version it ended at."""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

from grouprl.models import tiny_causal_lm
from grouprl.rollout.vllm_weights import full_tensors
from grouprl.trainer.trainer import Trainer
from tests.helpers.servers import TINY64
from tests.helpers.trainer import PROMPTS, base_config

SETTINGS = dict(prompts_per_step=4, group_size=4, micro_batch_size=4, total_steps=3, max_new_tokens=16, lr=1e-3,
                beta=0.0, eval_every=0, eval_samples=1, engine="ddp")
"""The runs compared: 16 rows a step (8 per process in two), one minibatch (exact across processes)."""


def distinct_share(prompts, completions, **_):
    """Share of a completion's characters that are distinct (varies within a group of random text)."""
    return [len(set(c)) / max(len(c), 1) for c in completions]


def served_run(out: Path, servers: Any, processes: Any = None, kill_first: bool = False, fail_at: int = 0,
               **settings: Any) -> dict[str, Any]:
    """Train the tiny head-64 model (seed 5) through ``servers`` (addresses or a number); what it recorded.
    ``kill_first``: the process that started local servers kills the first one once its first rollout is in;
    ``fail_at``: the reward function raises at its ``fail_at``-th call (0: never)."""
    model, tok = tiny_causal_lm(seed=5, **TINY64)
    config = base_config(out, output_dir=str(out / "run"), rollout_servers=servers, **{**SETTINGS, **settings})
    scored = []

    def reward(prompts, completions, **kw):
        scored.append(1)
        local = trainer.sampler.local
        if kill_first and len(scored) == 1 and local is not None:
            os.kill(local.processes[0].pid, signal.SIGKILL)
        if len(scored) == fail_at:
            raise RuntimeError(f"reward failed on purpose at call {fail_at}")
        return distinct_share(prompts, completions, **kw)

    trainer = Trainer(config, policy=model, tokenizer=tok, reward_fns=[reward], train_data=PROMPTS,
                      eval_data=PROMPTS[:2], processes=processes)
    versions, collect = [], trainer.collector.collect

    def recording(step, timer):
        got = collect(step, timer)
        versions.append(list(got.batch.info["policy_version"]))
        return got

    trainer.collector.collect = recording
    sampler = trainer.sampler
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.train()
        # whole under FSDP too (a collective: every process gathers)
        weights = {k: v.clone() for k, v in full_tensors(trainer.policy, torch.device("cpu"))}
        return {"weights": {k.removeprefix("module."): v for k, v in weights.items()}, "versions": versions,
                "pushes": sampler.handover.sender is not None, "version": sampler.handover.version,
                "pushed": sampler.handover.pushed,
                "streams": sampler.handover.streams_pushes,
                "addresses": [s.address for s in sampler.pool.servers], "local": sampler.local is not None,
                "local_pids": [p.pid for p in sampler.local.processes] if sampler.local is not None else [],
                "dropped": [(s.address, s.why) for s in sampler.pool.servers if not s.alive],
                "warnings": [str(w.message) for w in caught],
                "metrics": [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
                if (out / "run" / "metrics.jsonl").exists() else []}
    finally:
        trainer.close()


def server_group(rank: int, world: int, store_file: str, out: str) -> None:
    """Each process's run (an entry point of ``torch.multiprocessing.start_processes``); the servers to use are
    and what to do to them in ``out/plan.json``."""
    faulthandler.enable()
    torch.set_num_threads(1)
    from grouprl.trainer.dist.group import init_distributed
    from grouprl.trainer.dist.processes import Processes

    env = init_distributed(rank=rank, world_size=world, init_method=f"file://{store_file}", device="cpu",
                           timeout_s=600)
    out = Path(out)
    plan = json.loads((out / "plan.json").read_text())
    servers = tuple(plan["servers"]) if isinstance(plan["servers"], list) else plan["servers"]
    try:
        config = base_config(out, rollout_servers=servers, **{**SETTINGS, **plan["settings"]})
        fail_at = plan["fail_at"].get(str(rank), 0)
        result = served_run(out, servers, Processes(env, config), kill_first=plan["kill_first"], fail_at=fail_at,
                            **plan["settings"])
    except Exception as e:  # noqa: BLE001 - recorded for the test to read
        result = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
    torch.save(result, out / f"rank{rank}.pt")


def start(out: Path, servers: Any, world: int = 2, kill_first: bool = False, fail_at: dict[int, int] | None = None,
          **settings: Any) -> list[dict[str, Any]]:
    """Run :func:`server_group` in ``world`` processes (forked from a fork server that imported this module and
    nothing else ran in, as :func:`tests.helpers.dist.start_group`); each process's record."""
    import multiprocessing

    import torch.multiprocessing as mp

    out.mkdir(parents=True, exist_ok=True)
    plan = {"servers": servers, "kill_first": kill_first, "settings": settings,
            "fail_at": {str(r): n for r, n in (fail_at or {}).items()}}
    (out / "plan.json").write_text(json.dumps(plan))
    multiprocessing.get_context("forkserver").set_forkserver_preload([__name__])
    mp.start_processes(server_group, args=(world, str(out / "store"), str(out)), nprocs=world,
                       start_method="forkserver")
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]
