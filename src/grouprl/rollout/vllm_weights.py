"""Between the trainer's weights and a vLLM engine's (:mod:`grouprl.rollout.vllm`): pushed names, FSDP shards
gathered one tensor at a time, and functions run inside the engine (``collective_rpc``) to free and restore memory."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn


def base_weight_name(name: str) -> str | None:
    """A peft LoRA model's parameter name as the plain model calls it; None for adapter weights."""
    if ".lora_" in name:
        return None
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def wrapped_weight_name(name: str, engine_params: set[str], packed: dict[str, list[str]]) -> str:
    """A plain weight ``name`` as an older vLLM's LoRA engine takes it: ``.base_layer.`` inserted where the
    engine wraps the module, looked up under its packed name (``packed``: q_proj -> qkv_proj); else ``name``."""
    module, _, param = name.rpartition(".")
    parent, _, leaf = module.rpartition(".")
    owner = next((group for group, leaves in packed.items() if leaf in leaves), leaf)
    engine_module = f"{parent}.{owner}" if parent else owner
    return f"{module}.base_layer.{param}" if f"{engine_module}.base_layer.{param}" in engine_params else name


def resolves_lora_wrappers() -> bool:
    """Whether this vLLM (after 0.26) reloads a LoRA engine's base weights under their plain names."""
    try:
        from vllm.model_executor.model_loader.reload.inplace import get_parameter_for_reload  # noqa: F401
    except ImportError:
        return False
    return True


def engine_parameters(worker: Any) -> tuple[list[str], dict[str, list[str]]]:
    """(parameter names, packed modules) of a vLLM worker's model; run inside the engine."""
    model = worker.model_runner.get_model()
    return [n for n, _ in model.named_parameters()], dict(getattr(model, "packed_modules_mapping", {}))


def free_weights(worker: Any) -> dict[str, int]:
    """Free a CPU engine's weights, inside the engine: the packed ``cpu_linear`` copies (rebuilt by every reload)
    and every parameter's storage. Returns each parameter's bytes, for :func:`restore_weights`."""
    model = worker.model_runner.get_model()
    for module in model.modules():
        if getattr(module, "cpu_linear", None) is not None:
            module.cpu_linear = None
    params = [(n, p.untyped_storage()) for n, p in model.named_parameters()]
    sizes = {n: s.nbytes() for n, s in params}  # all read before any shared storage shrinks
    for _, storage in params:
        storage.resize_(0)
    return sizes


def restore_weights(worker: Any, sizes: dict[str, int]) -> None:
    """Give every parameter :func:`free_weights` emptied its storage again (``sizes``: what it returned)."""
    for n, p in worker.model_runner.get_model().named_parameters():
        p.untyped_storage().resize_(sizes[n])


def kv_storages(worker: Any) -> list[torch.UntypedStorage]:
    """The storages behind a vLLM worker's KV cache, each once (its layers are views of one buffer)."""
    # keyed by the storage itself (_cdata): its data pointer is 0 for every storage once emptied
    storages = {s._cdata: s for s in (t.untyped_storage() for t in worker.model_runner.kv_caches)}
    return list(storages.values())


def free_kv_cache(worker: Any) -> list[int]:
    """Empty a CPU engine's KV cache storages, inside the engine; their bytes, for :func:`restore_kv_cache`."""
    storages = kv_storages(worker)
    sizes = [s.nbytes() for s in storages]
    for storage in storages:
        storage.resize_(0)
    return sizes


def restore_kv_cache(worker: Any, sizes: list[int]) -> None:
    """Give the KV cache :func:`free_kv_cache` emptied its memory again, zeroed as vLLM allocates it (a
    kernel may read a block's unwritten slots under a zero weight, and 0 * NaN is NaN)."""
    for storage, size in zip(kv_storages(worker), sizes, strict=True):
        storage.resize_(size)
        torch.empty(0, dtype=torch.int8).set_(storage, 0, (size,)).zero_()


def full_tensors(model: nn.Module, device: torch.device | None,
                 keep: Callable[[str], bool] = lambda name: True) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) of ``model``'s state dict entries ``keep`` accepts, one at a time (a collective)."""
    for name, t in model.state_dict().items():
        if keep(name):
            yield name, whole(t, device)


def whole(t: torch.Tensor, device: torch.device | None) -> torch.Tensor:
    """``t`` whole: an FSDP shard gathered on the device its process group trains on (a CPU-offloaded shard too;
    a collective), then moved to ``device`` (None: left there); any other tensor as it is."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.to(t.device_mesh.device_type).full_tensor()
        t = t.to(device) if device is not None else t
    return t.detach()
