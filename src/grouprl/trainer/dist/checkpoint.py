"""Checkpoints of a multi-process run, in ``<output_dir>/checkpoints/step-000010/``::

    model/          the policy gathered into process 0 (with LoRA the adapter alone): what `grouprl eval` reads
    dcp/            torch.distributed.checkpoint of {policy, optimizer[, reference]}, each process's shards
    <name>.pt       the other stateful parts (the learning-rate schedule), from process 0
    rng/rank-N.pt   each process's random state
    state.json      step, data position, world size, config

Published from a temporary folder once every process has written; resuming needs the same number of processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from grouprl.models.lora import unwrap_ddp
from grouprl.run.checkpoint_files import publish, rng_state, set_rng_state, temporary_folder, verify_checkpoint
from grouprl.trainer.dist.group import DistEnv

SHARDED = "optimizer"  # the stateful part saved in shards beside the policy; the others, small, by process 0


def save_gathered_policy(policy: nn.Module, folder: Path, tokenizer: Any, env: DistEnv) -> None:
    """The full policy into ``folder`` on process 0 (collective: every process calls it)."""
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from grouprl.rollout.engines import plain_class_name

    full = get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not env.is_main:
        return
    inner = unwrap_ddp(policy)
    folder.mkdir(parents=True, exist_ok=True)
    if hasattr(inner, "peft_config"):  # peft keeps only the adapter's entries of the full state dict
        inner.save_pretrained(str(folder), state_dict=full)
    else:
        # a tied tensor (the LM head) is saved once, under its first name
        tied = {n for n, _ in inner.named_parameters(remove_duplicate=False)} - {n for n, _ in inner.named_parameters()}
        save_file({k: v.contiguous() for k, v in full.items() if k not in tied}, str(folder / "model.safetensors"),
                  metadata={"format": "pt"})
        config = getattr(inner, "config", None)
        if config is not None:
            config.architectures = [plain_class_name(inner)]
            config.save_pretrained(str(folder))
        if getattr(inner, "generation_config", None) is not None:
            inner.generation_config.save_pretrained(str(folder))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))


def _payload(policy: nn.Module, optimizer: Any, reference: nn.Module | None) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        out = {"policy": get_model_state_dict(policy)}
    else:
        model_sd, optim_sd = get_state_dict(policy, optimizer)
        out = {"policy": model_sd, "optimizer": optim_sd}
    if reference is not None:
        out["reference"] = get_model_state_dict(reference)
    return out


def save_dist_checkpoint(root: Path, step: int, *, env: DistEnv, policy: nn.Module, state: dict[str, Any],
                         tokenizer: Any = None, reference: nn.Module | None = None,
                         stateful: dict[str, Any] | None = None, modules: dict[str, nn.Module] | None = None,
                         keep: int = 2) -> Path:
    """:func:`grouprl.run.checkpoint_files.save_checkpoint` from every process (a collective)."""
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_model

    stateful = dict(stateful or {})
    tmp, final = Path(), Path()
    if env.is_main:
        tmp, final = temporary_folder(root, step, "dist")
        (tmp / "rng").mkdir()
    box = [[str(tmp), str(final)]]
    dist.broadcast_object_list(box, src=0)  # process 0's folders in every process
    tmp, final = map(Path, box[0])
    dcp.save(_payload(policy, stateful.pop(SHARDED, None), reference), checkpoint_id=str(tmp / "dcp"))
    save_gathered_policy(policy, tmp / "model", tokenizer, env)
    torch.save(rng_state(), tmp / "rng" / f"rank-{env.rank}.pt")
    if env.is_main:
        for name, obj in stateful.items():
            torch.save(obj.state_dict(), tmp / f"{name}.pt")
        for name, module in (modules or {}).items():
            save_model(module, str(tmp / f"{name}.safetensors"))
        text = json.dumps({"step": step, "world_size": env.world_size, **state}, indent=2, default=str)
        (tmp / "state.json").write_text(text)
    dist.barrier()  # every process's files are in place
    if env.is_main:
        publish(tmp, final, keep)
    dist.barrier()
    return final


def load_dist_checkpoint(folder: Path, *, env: DistEnv, policy: nn.Module, reference: nn.Module | None = None,
                         stateful: dict[str, Any] | None = None,
                         modules: dict[str, nn.Module] | None = None) -> dict[str, Any]:
    """Restore what :func:`save_dist_checkpoint` wrote (a collective); returns the state dict."""
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_model
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    verify_checkpoint(folder)
    state = json.loads((folder / "state.json").read_text())
    saved_world = state.get("world_size")
    if not (folder / "dcp").is_dir() or saved_world is None:
        raise ValueError(f"{folder} was written by a run without a process group (one process on a CPU): resume it "
                         f"there (CUDA_VISIBLE_DEVICES= on a GPU machine), or start from its weights with --model "
                         f"{folder / 'model'}")
    if saved_world != env.world_size:
        raise ValueError(f"{folder} was written by {saved_world} processes; resume it with the same number "
                         f"(--nproc {saved_world}), not {env.world_size}")
    stateful = dict(stateful or {})
    optimizer = stateful.pop(SHARDED, None)
    # reference weights are there only when reference sync moved them
    saved = dcp.FileSystemReader(str(folder / "dcp")).read_metadata().state_dict_metadata
    with_reference = reference if reference is not None and any(k.startswith("reference.") for k in saved) else None
    payload = _payload(policy, optimizer, with_reference)
    dcp.load(payload, checkpoint_id=str(folder / "dcp"))
    if optimizer is None:
        set_model_state_dict(policy, payload["policy"])
    else:
        set_state_dict(policy, optimizer, model_state_dict=payload["policy"], optim_state_dict=payload["optimizer"])
    if with_reference is not None:
        set_model_state_dict(with_reference, payload["reference"])
    for name, obj in stateful.items():
        obj.load_state_dict(torch.load(folder / f"{name}.pt", weights_only=False))
    for name, module in (modules or {}).items():
        load_model(module, str(folder / f"{name}.safetensors"))
    set_rng_state(torch.load(folder / "rng" / f"rank-{env.rank}.pt", weights_only=False))
    return state
