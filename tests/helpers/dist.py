"""Multi-process trainer tests: ranks spawned inside pytest with a FileStore rendezvous.

Imports cost seconds per process on a loaded machine, so one spawned group runs several
scenarios in a row and writes what each produced (final weights, metrics, errors) to files that
the tests read afterwards.
"""

from __future__ import annotations

import faulthandler
import json
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from grouprl.models import tiny_causal_lm
from grouprl.rollout.sampler import Sampler
from grouprl.trainer.trainer import Trainer
from grouprl.types import RolloutBatch, SamplingParams
from tests.helpers.trainer import base_config, digit_share

PROMPTS = [{"prompt": f"Count: {i}", "target": "7"} for i in range(10, 26)]
"""Prompts of one token length, so every batch has the same prompt width."""

SETTINGS = {"prompts_per_step": 4, "group_size": 4, "micro_batch_size": 4, "total_steps": 3, "lr": 1e-3,
            "log_completions_every": 1, "eval_every": 0}


class PromptSeededSampler(Sampler):
    """The built-in engine drawing each prompt's group from a seed of (training step, prompt tokens) and padding
    every batch to fixed widths, so a prompt's completions are the same whichever process, and whichever
    batch, draws them: 2 processes x half the prompts then see exactly the rollouts of 1 process x
    all of them, and the test measures the training, not the sampler's batch-dependent draws."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any):
        super().__init__(model, tokenizer)
        self.trainer: Any = None  # set once the trainer exists: its step count seeds the draws

    def generate(self, prompt_ids: list[list[int]], group_size: int, params: SamplingParams, *,
                 seed: int | None = None, prompts: list | None = None,
                 extras: dict[str, list] | None = None) -> RolloutBatch:
        parts = []
        for i, ids in enumerate(prompt_ids):
            one_seed = hash((self.trainer.step_count, tuple(ids))) % (2**31)
            parts.append(super().generate([ids], group_size, params, seed=one_seed,
                                          prompts=None if prompts is None else [prompts[i]],
                                          extras={k: [v[i]] for k, v in (extras or {}).items()}))
        batch = RolloutBatch.cat(parts)
        pad = params.max_new_tokens - batch.completion_ids.shape[1]
        wide = torch.nn.functional.pad
        return replace(batch, completion_ids=wide(batch.completion_ids, (0, pad), value=batch.pad_token_id),
                       completion_mask=wide(batch.completion_mask, (0, pad)),
                       sampling_logprobs=wide(batch.sampling_logprobs, (0, pad)))


def has_a_digit(completion: str, row: dict) -> bool:
    return any(ch.isdigit() for ch in completion)


def build(tmp: Path, name: str, *, env: Any = None, reward_fns: tuple = (digit_share,), evaluated: bool = False,
          **overrides: Any):
    """A GRPO trainer on the tiny model, one-process or distributed (``env`` given); ``evaluated``: with
    5 held-out prompts scored by :func:`has_a_digit`."""
    config = base_config(tmp / name, **{**SETTINGS, **overrides})
    torch.manual_seed(0)  # LoRA adapters are initialised from the global generator
    model, tok = tiny_causal_lm(seed=0)
    sampler = PromptSeededSampler(model, tok)
    kwargs = dict(policy=model, tokenizer=tok, reward_fns=list(reward_fns), train_data=PROMPTS, sampler=sampler,
                  eval_data=PROMPTS[:5] if evaluated else None, is_correct=has_a_digit if evaluated else None)
    if env is not None:
        from grouprl.trainer.dist.processes import Processes

        kwargs["processes"] = Processes(env, config)
    trainer = Trainer(config, **kwargs)
    sampler.trainer = trainer
    from grouprl.models.lora import unwrap_ddp

    sampler.update_weights(unwrap_ddp(trainer.policy))  # with LoRA, decode through the peft wrapper (the FSDP root)
    return trainer


def full_weights(trainer: Any) -> dict[str, torch.Tensor]:
    """The policy's full weights (gathered from the shards under FSDP; collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not torch.distributed.is_initialized():
        return {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}
    return get_model_state_dict(trainer.policy, options=StateDictOptions(full_state_dict=True))


def fails_on_rank_one(prompts, completions, **_):
    """A reward function that raises in process 1 only."""
    if torch.distributed.get_rank() == 1:
        raise ZeroDivisionError("the reward of process one divides by zero")
    return [0.0] * len(completions)


def digit_share_but_threes(prompts, completions, **_):
    """:func:`digit_share`, but 0.5 for prompts ending in a multiple of 3: their groups are
    all-equal, so they leave the loss (zero_std_groups drop) and get no passes; a process whose share is
    all such groups still makes the passes the other makes (with a row that carries nothing)."""
    shares = digit_share(prompts, completions)
    return [0.5 if int(p.split()[-1]) % 3 == 0 else s for p, s in zip(prompts, shares)]


SCENARIOS = {
    "ddp": dict(engine="ddp", rollout_is="token", reward_fns=(digit_share_but_threes,)),
    "fsdp": dict(engine="fsdp", advantage_scale="batch", save_every=1, reward_fns=(digit_share_but_threes,)),
}
"""name -> trainer settings of the 3-step runs compared with one process."""


def _run(rank: int, out: Path, name: str, fn: Any) -> None:
    """Run ``fn()`` and record its result (or its error) for this rank."""
    try:
        result = fn()
    except Exception as e:  # noqa: BLE001 - recorded for the test to read
        result = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
    if rank == 0 or "error" in result:
        torch.save(result, out / f"{name}-rank{rank}.pt")


def two_process_group(rank: int, world: int, store_file: str, out: str) -> None:
    """Every scenario, in order, in one spawned group (the entry point of ``mp.spawn``)."""
    faulthandler.enable()  # a process killed by a signal shows its Python stack in the test's output
    torch.set_num_threads(1)
    from grouprl.trainer.dist.group import init_distributed

    env = init_distributed(rank=rank, world_size=world, init_method=f"file://{store_file}", device="cpu",
                           timeout_s=240)
    out = Path(out)

    def three_steps(name: str) -> dict[str, Any]:
        trainer = build(out, name, env=env, **SCENARIOS[name])
        summary = trainer.train()
        return {"weights": full_weights(trainer), "summary": summary, "metrics": metrics_lines(out / name / "run", env),
                **_pushes(trainer, rank)}

    def resumed() -> dict[str, Any]:
        start = out / "fsdp" / "run" / "checkpoints" / "step-000002"
        trainer = build(out, "fsdp", env=env, **SCENARIOS["fsdp"], resume_from=str(start))
        trainer.train()
        return {"weights": full_weights(trainer), "metrics": metrics_lines(out / "fsdp" / "run", env)}

    def reward_error() -> dict[str, Any]:
        build(out, "error", env=env, reward_fns=(fails_on_rank_one,)).train()
        return {}

    for name in SCENARIOS:
        _run(rank, out, name, lambda name=name: three_steps(name))
    _run(rank, out, "resumed", resumed)
    _run(rank, out, "reward_error", reward_error)


VARIANTS = {
    "fsdp_lora": dict(engine="fsdp", lora_rank=4, lr=1e-2),
    "fsdp_offload": dict(engine="fsdp", cpu_offload=True),
    "ddp_sequence_is": dict(engine="ddp", rollout_is="sequence", kl_in_reward=True),
    "fsdp_ref_sync": dict(engine="fsdp", ref_sync_steps=1, ref_sync_alpha=0.5, save_every=1),
    "fsdp_bf16": dict(engine="fsdp", mixed_precision="bf16"),
}
"""name -> settings of the slower variants; all but fsdp_bf16 are compared with one process
(bf16 computes differently from the fp32 one-process run by design)."""


def _pushes(trainer: Any, rank: int) -> dict[str, Any]:
    """What a rollout server push reads from the policy, as process 0 holds it: the file the files transport
    writes (read back, under the state dict's names; a LoRA model's adapters beside it) and the tensors a
    collective transport sends (LoRA merged). Every process takes part in each gather; process 0 alone keeps."""
    import tempfile

    from safetensors.torch import load_file

    from grouprl.models.lora import unwrap_ddp
    from grouprl.serve.weights.sent import tensors_to_send
    from grouprl.serve.weights.transport import WEIGHTS_FILE, plain_name, reading, write_weights_file

    policy = unwrap_ddp(trainer.policy)  # as the rollout servers' sampler follows it
    read = reading(policy, dtype=torch.float32)
    if rank != 0:
        read.drain()
        reading(policy).drain()  # the write that fails in process 0, read to its end here as there
        reading(policy).drain()
        return {"files": None, "sent": None}
    with tempfile.TemporaryDirectory() as folder:
        adapters: dict[str, torch.Tensor] = {}
        with read.through():
            write_weights_file(policy, read, Path(folder), adapters)
        written = load_file(str(Path(folder) / WEIGHTS_FILE))
        failed = _failing_write(policy, Path(folder) / "full")
    plain = plain_name(policy)
    files = {e.name: written[plain(e.name)] if plain(e.name) is not None else adapters[e.name] for e in read.entries}
    # under FSDP a gather the failed write left unread would pair with this one's first: a hang or wrong tensors
    sent = tensors_to_send(policy, torch.float32, dict(reading(policy).tensors))
    return {"files": files, "sent": dict(sent), "failed": failed}


def _failing_write(policy: Any, folder: Path) -> str:
    """Process 0's write of a push that fails at its fourth tensor (the disk full): what it raised."""
    import dataclasses

    from grouprl.serve.weights.transport import reading, write_weights_file

    read = reading(policy)

    def full_disk():
        for i, item in enumerate(read.tensors):
            if i == 3:
                raise OSError("No space left on device")
            yield item

    try:
        with read.through():
            write_weights_file(policy, dataclasses.replace(read, tensors=full_disk()), folder)
    except OSError as e:
        return str(e)
    return "no error"


def variant_group(rank: int, world: int, store_file: str, out: str) -> None:
    """The variants, then a resume of the reference-sync run (its reference is in the checkpoint),
    then an evaluation split over the two processes (an entry point of ``mp.spawn``)."""
    faulthandler.enable()
    torch.set_num_threads(1)
    from grouprl.trainer.dist.group import init_distributed

    env = init_distributed(rank=rank, world_size=world, init_method=f"file://{store_file}", device="cpu",
                           timeout_s=240)
    out = Path(out)

    def three_steps(name: str) -> dict[str, Any]:
        trainer = build(out, name, env=env, **VARIANTS[name])
        trainer.train()
        reference = _full_reference(trainer) if trainer.reference is not None else None
        return {"weights": full_weights(trainer), "reference": reference, **_pushes(trainer, rank)}

    def resumed() -> dict[str, Any]:
        start = out / "fsdp_ref_sync" / "run" / "checkpoints" / "step-000002"
        trainer = build(out, "fsdp_ref_sync", env=env, **VARIANTS["fsdp_ref_sync"], resume_from=str(start))
        trainer.train()
        return {"weights": full_weights(trainer), "reference": _full_reference(trainer)}

    def evaluation() -> dict[str, Any]:
        trainer = build(out, "eval", env=env, eval_samples=2, evaluated=True)
        from grouprl.rollout.vllm_weights import full_tensors

        pushed = dict(full_tensors(trainer.policy, torch.device("cpu")))  # what a vLLM weight push sends
        return {"eval": trainer.evaluate(), "pushed": pushed, "weights": full_weights(trainer)}

    for name in VARIANTS:
        _run(rank, out, name, lambda name=name: three_steps(name))
    _run(rank, out, "ref_sync_resumed", resumed)
    _run(rank, out, "evaluation", evaluation)


def _full_reference(trainer: Any) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not torch.distributed.is_initialized():
        return {k: v.detach().clone() for k, v in trainer.reference.state_dict().items()}
    return get_model_state_dict(trainer.reference, options=StateDictOptions(full_state_dict=True))


def metrics_lines(run_dir: Path, env: Any = None) -> list[dict[str, Any]]:
    """The run's metrics records (only process 0 writes them)."""
    if env is not None and not env.is_main:
        return []
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def start_group(fn: Any, out: Path, world: int = 2) -> None:
    """Run ``fn(rank, world, store_file, out)`` in ``world`` processes and wait for them.

    Forked from a fork server that imported this module and nothing else ran in: the children
    start with transformers' model code already imported (10-20 s per process on a loaded
    machine), and never inherit the state of a process that has trained (OpenMP's thread pool,
    locks held by native threads), which can abort a child forked from the test process itself."""
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.get_context("forkserver").set_forkserver_preload([__name__])
    mp.start_processes(fn, args=(world, str(out / "store"), str(out)), nprocs=world, start_method="forkserver")
