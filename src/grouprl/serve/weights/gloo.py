"""vLLM's weight-transfer protocol over gloo (TCP), for servers without a GPU, registered in vLLM's engine factories
as :data:`BACKEND`: vLLM's NCCL engines with another group and broadcast (vLLM's own backends need CUDA). Workers
import this module through ``--worker-extension-cls`` (:class:`GlooWorkerExtension`)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar

import torch
from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory
from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo, worker_init_payload
from vllm.distributed.weight_transfer.nccl_engine import (
    NCCLTrainerInitInfo,
    NCCLTrainerWeightTransferEngine,
    NCCLWeightTransferEngine,
    NCCLWeightTransferUpdateInfo,
)

BACKEND = "gloo"
DEFAULT_TIMEOUT_S = 600.0


def chunk_bounds(sizes: Sequence[int], limit: int) -> list[tuple[int, int]]:
    """Tensors ``[start, stop)`` of each chunk: tensors join a chunk until its bytes pass ``limit`` (that one
    included), as vLLM's packed NCCL producer and consumer cut them.

    >>> chunk_bounds([4, 4, 4, 10, 1], 7)
    [(0, 2), (2, 4), (4, 5)]
    """
    if limit < 1:
        raise ValueError(f"a chunk must hold at least 1 byte, got {limit}")
    bounds, start, total = [], 0, 0
    for i, size in enumerate(sizes):
        total += size
        if total > limit:
            bounds.append((start, i + 1))
            start, total = i + 1, 0
    if start < len(sizes):
        bounds.append((start, len(sizes)))
    return bounds


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s contents as a flat uint8 tensor ``[numel * element_size]``."""
    return tensor.detach().contiguous().view(-1).view(torch.uint8)


def from_bytes(buffer: torch.Tensor, dtypes: Sequence[torch.dtype],
               shapes: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """Split a uint8 ``buffer`` into tensors of ``dtypes`` and ``shapes``: views, or copies where misaligned."""
    sizes = [math.prod(s) * d.itemsize for d, s in zip(dtypes, shapes)]
    if sum(sizes) != buffer.numel():
        raise ValueError(f"a chunk of {buffer.numel()} bytes cannot hold tensors of {sum(sizes)} bytes")
    parts = buffer.split(sizes)
    return [(p if p.storage_offset() % d.itemsize == 0 else p.clone()).view(d).view(tuple(s))
            for p, d, s in zip(parts, dtypes, shapes)]


class GlooGroup:
    """A gloo group outside ``torch.distributed``'s global state, with the calls vLLM's engine makes."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, timeout_s: float = DEFAULT_TIMEOUT_S):
        from torch.distributed import PrefixStore
        from vllm.distributed.utils import StatelessProcessGroup, init_gloo_process_group

        rendezvous = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size,
                                                  store_timeout=int(math.ceil(timeout_s)))
        self.group = init_gloo_process_group(PrefixStore("grouprl-weights", rendezvous.store), rank, world_size,
                                             timedelta(seconds=timeout_s))
        self.rank, self.world_size = rank, world_size

    def broadcast(self, tensor: torch.Tensor, src: int, stream: Any = None) -> None:
        from torch.distributed import BroadcastOptions

        options = BroadcastOptions()
        options.rootRank, options.rootTensor = src, 0
        self.group.broadcast([tensor], options).wait()

    def destroy(self) -> None:
        self.group.shutdown()


@dataclass(kw_only=True)
class GlooInitInfo(NCCLWeightTransferInitInfo):  # a worker's side of the handshake
    timeout_s: float = DEFAULT_TIMEOUT_S


class GlooWeightTransferEngine(NCCLWeightTransferEngine):  # the worker's engine
    init_info_cls = GlooInitInfo

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        p = self.parallel_config  # as vLLM ranks its NCCL workers: across data-parallel replicas
        rank = init_info.rank_offset + p.data_parallel_index * p.world_size + p.rank
        self.packed_buffer_size_bytes = init_info.packed_buffer_size_bytes
        self.model_update_group = GlooGroup(init_info.master_address, init_info.master_port, rank,
                                            init_info.world_size, init_info.timeout_s)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))  # nothing to synchronise: no device streams

    def receive_weights(self, update_info: NCCLWeightTransferUpdateInfo) -> None:
        if self.model_update_group is None:
            raise RuntimeError("the gloo weight transfer was not initialised (init_weight_transfer_engine)")
        from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check

        dtypes = [getattr(torch, d) for d in update_info.dtype_names]
        sizes = [math.prod(s) * d.itemsize for d, s in zip(dtypes, update_info.shapes)]
        with disable_mtp_completeness_check():
            for start, stop in chunk_bounds(sizes, self.packed_buffer_size_bytes):
                buffer = torch.empty(sum(sizes[start:stop]), dtype=torch.uint8)
                self.model_update_group.broadcast(buffer, src=0)
                tensors = from_bytes(buffer, dtypes[start:stop], update_info.shapes[start:stop])
                self.model.load_weights(list(zip(update_info.names[start:stop], tensors)))


@dataclass
class GlooTrainerInitInfo(NCCLTrainerInitInfo):  # the trainer's side (rank 0 sends)
    backend: ClassVar[str] = BACKEND
    timeout_s: float = DEFAULT_TIMEOUT_S


class GlooTrainerWeightTransferEngine(NCCLTrainerWeightTransferEngine):
    init_info_cls = GlooTrainerInitInfo

    @classmethod
    def trainer_init(cls, init_info: GlooTrainerInitInfo, *, client: Any,
                     source: WeightSource | None = None) -> GlooTrainerWeightTransferEngine:
        engine = cls(client=client, source=source, is_sender=init_info.is_sender,
                     packed_buffer_size_bytes=init_info.packed_buffer_size_bytes)
        if not engine.is_sender:
            return engine
        worker = GlooInitInfo(master_address=init_info.master_address, master_port=init_info.master_port,
                              rank_offset=1, world_size=init_info.world_size, packed=True,
                              packed_buffer_size_bytes=init_info.packed_buffer_size_bytes,
                              timeout_s=init_info.timeout_s)
        with ThreadPoolExecutor(max_workers=1) as pool:  # the workers wait inside the request for the rendezvous
            joined = pool.submit(client.init_weight_transfer_engine, worker_init_payload(worker))
            engine.model_update_group = GlooGroup(init_info.master_address, init_info.master_port, 0,
                                                  init_info.world_size, init_info.timeout_s)
            joined.result()
        return engine

    def _broadcast(self, source: WeightSource, meta: list[ParamMeta]) -> None:
        if not self.is_sender:
            for _ in source:
                pass
            return
        sizes = [math.prod(m.shape) * m.dtype.itemsize for m in meta]
        pairs: Iterator[tuple[str, torch.Tensor]] = self._checked_iter(source, meta)
        for start, stop in chunk_bounds(sizes, self.packed_buffer_size_bytes):
            chunk = torch.cat([as_bytes(next(pairs)[1]).cpu() for _ in range(start, stop)])
            self.model_update_group.broadcast(chunk, src=0)
        for _ in pairs:  # runs the check that the source yielded no more than its metadata
            pass


class GlooWorkerExtension:
    """Named in ``--worker-extension-cls`` so that every worker imports this module; it adds no method."""


for _factory, _engine in ((WeightTransferEngineFactory, GlooWeightTransferEngine),
                          (WeightTransferTrainerFactory, GlooTrainerWeightTransferEngine)):
    if BACKEND not in _factory._registry:  # once per process
        _factory.register_engine(BACKEND, _engine)
