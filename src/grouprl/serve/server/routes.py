"""grouprl's routes on a rollout server's vLLM app (the contract: docs/servers.md): ``GET /grouprl/info``,
``POST /grouprl/weights`` (a folder push, checked first) and ``POST /grouprl/transfer/{init,start,update,finish,abort,
shutdown}`` (the same load over vLLM's weight transfer, under a lease). vLLM's own weight routes come only with its
development mode, which opens arbitrary RPCs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, Field

from grouprl.serve.server.guard import Refusal
from grouprl.serve.server.leases import Transfers
from grouprl.serve.server.pushes import PushRefused, check_adapter, check_full, version_refusal, within_root

router = APIRouter(prefix="/grouprl")


@dataclass
class ServerState:
    """What a server holds besides vLLM's engine."""

    model: str
    dtype: str
    max_model_len: int
    lora_rank: int | None
    facts: dict[str, Any]
    version: int | None = None
    adapter: str | None = None  # the LoRA request's name (a request's ``model``); None: base weights
    adapter_id: int | None = None
    weight_transfer: str | None = None  # vLLM's weight-transfer backend enabled; None: folders only
    workers: int = 1  # vLLM workers: each is a rank of a trainer's weight-transfer group
    address: str = ""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    weights_complete: bool = True  # False from a transfer's start until a push completes
    transfers: Transfers | None = None
    weights_root: Path | None = None  # folder pushes come from under it only (None: none)
    tensors: dict[str, tuple[int, ...]] = field(default_factory=dict)  # the served weights, name -> shape
    adapter_version: int | None = None
    broken: str | None = None  # why generation answers 503 until a complete push loads

    def describe(self) -> str:
        lora = f", LoRA up to rank {self.lora_rank}" if self.lora_rank else ""
        transfer = f" or over {self.weight_transfer}" if self.weight_transfer else ""
        folders = f"folders under {self.weights_root}" if self.weights_root else "no folders"
        return (f"{self.model} in {self.dtype}{lora}, up to {self.max_model_len} tokens a sequence, weights from "
                f"{folders}{transfer}, a token on every route but /health")

    def info(self) -> dict[str, Any]:
        return {"version": self.version, "weights_complete": self.weights_complete, "adapter": self.adapter,
                "model": self.model, "dtype": self.dtype,
                "max_model_len": self.max_model_len, "lora_rank": self.lora_rank, "facts": self.facts,
                "weight_transfer": self.weight_transfer, "workers": self.workers, "broken": self.broken}


class LoadWeights(BaseModel):
    path: str
    version: int
    adapter: bool = False
    resume: bool = False  # the trainer restarts a run: this version may be older than the one held


@router.get("/info")
async def info(request: Request) -> dict[str, Any]:
    return request.app.state.grouprl.info()


@contextlib.contextmanager
def _refusals(state: ServerState) -> Iterator[None]:
    """A push or transfer call refused is an HTTP error naming this server."""
    try:
        yield
    except Refusal as e:
        raise HTTPException(e.status, f"this server ({state.address}): {e.message}") from e


def _forward_only(state: ServerState, version: int, resume: bool, adapter: bool) -> None:
    """:func:`~.pushes.version_refusal`; the first adapter may carry its base's version, later ones must be newer."""
    first_adapter = adapter and state.adapter_version is None
    held = state.adapter_version if adapter and not first_adapter else state.version
    what = "adapter" if adapter and not first_adapter else "weights"
    if refusal := version_refusal(held, version, resume, what, equal_ok=first_adapter):
        raise HTTPException(HTTPStatus.CONFLICT, f"this server ({state.address}): {refusal}")


@router.post("/weights")
async def load_weights(body: LoadWeights, request: Request) -> dict[str, Any]:
    state: ServerState = request.app.state.grouprl
    engine = request.app.state.engine_client
    with _refusals(state):  # the checks that need no lock
        folder = within_root(body.path, state.weights_root)
        if not folder.is_dir():
            raise PushRefused(HTTPStatus.BAD_REQUEST, f"cannot see the weights folder {body.path}: trainer and "
                              "server need shared storage (weights_dir)")
        if body.adapter:
            check_adapter(folder, state.tensors, state.lora_rank)
        else:
            check_full(folder, state.tensors)
    start = time.perf_counter()
    async with state.lock:
        _forward_only(state, body.version, body.resume, body.adapter)
        await engine.pause_generation(mode="wait")
        try:
            if body.adapter:
                await _load_adapter(request, state, str(folder), body.version)
                state.adapter_version = body.version
            else:
                await _reload(engine, state, folder)
            await engine.reset_prefix_cache()
            await engine.update_weight_version(str(body.version))
            state.version = body.version
        finally:
            await engine.resume_generation()
    return {**state.info(), "seconds": time.perf_counter() - start}


async def _reload(engine: Any, state: ServerState, folder: Path) -> None:
    """Reload ``folder`` in place; a reload that fails midway leaves weights half-loaded: generation is refused (503)
    until a complete push loads."""
    state.weights_complete = False  # until the reload is whole
    try:
        await engine.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
    except Exception as e:  # noqa: BLE001 - the server stops generating, saying why
        state.broken = f"the weights in {folder} did not load ({type(e).__name__}: {str(e)[:300]})"
        print(f"grouprl serve: {state.broken}; generation refused until a complete push", flush=True)
        raise HTTPException(HTTPStatus.SERVICE_UNAVAILABLE, f"this server ({state.address}): {state.broken}") from e
    state.weights_complete, state.broken = True, None


async def _load_adapter(request: Request, state: ServerState, path: str, version: int) -> None:
    from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest

    models = request.app.state.openai_serving_models
    name = f"policy-v{version}"
    loaded = await models.load_lora_adapter(LoadLoRAAdapterRequest(lora_name=name, lora_path=path))
    if not isinstance(loaded, str):  # vLLM's ErrorResponse
        raise HTTPException(HTTPStatus.UNPROCESSABLE_ENTITY, f"the adapter in {path} did not load: {loaded}")
    old, old_id = state.adapter, state.adapter_id
    state.adapter, state.adapter_id = name, models.lora_requests[name].lora_int_id
    if old is not None and old != name:
        await models.unload_lora_adapter(UnloadLoRAAdapterRequest(lora_name=old))
        await request.app.state.engine_client.remove_lora(old_id)


class TransferInit(BaseModel):
    init_info: dict[str, Any]


class TransferStart(BaseModel):
    version: int
    lease_s: float = Field(gt=0, allow_inf_nan=False)  # the wait for the trainer's next call before abandoning
    wait_s: float = Field(ge=0, allow_inf_nan=False)  # the wait for the weights lock
    resume: bool = False


class TransferToken(BaseModel):
    token: str


class TransferAbort(TransferToken):
    why: str = ""


class TransferUpdate(TransferToken):
    update_info: dict[str, Any] | list[dict[str, Any]]


def _transfers(request: Request) -> Transfers:
    state: ServerState = request.app.state.grouprl
    if state.weight_transfer is None:
        raise HTTPException(HTTPStatus.BAD_REQUEST, f"this server ({state.address}) was started without a weight "
                            "transfer: start it with --rollout_weights_transport nccl (GPU) or gloo")
    if state.transfers is None:
        state.transfers = Transfers(state, request.app.state.engine_client)
    return state.transfers


def init_info_problem(backend: str, init_info: dict[str, Any]) -> str | None:
    """Why ``init_info`` is not vLLM's ``backend`` init info: inside vLLM's workers it would be a 500."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    import grouprl.serve.weights.gloo  # noqa: F401 - its import registers the gloo backend in this process too

    engine_class = WeightTransferEngineFactory._registry.get(backend)
    try:
        engine_class and engine_class().init_info_cls(**init_info)
    except (TypeError, ValueError) as e:
        return f"init_info is not the {backend} weight transfer's: {e}"
    return None


@router.post("/transfer/init")
async def transfer_init(body: TransferInit, request: Request) -> dict[str, Any]:
    from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

    transfers = _transfers(request)
    if (problem := init_info_problem(transfers.state.weight_transfer, body.init_info)) is not None:
        raise HTTPException(HTTPStatus.UNPROCESSABLE_ENTITY, problem)
    await transfers.engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=body.init_info))
    return transfers.state.info()


@router.post("/transfer/shutdown")
async def transfer_shutdown(request: Request) -> dict[str, Any]:
    transfers = _transfers(request)
    await transfers.engine.shutdown_weight_transfer_engine()
    return transfers.state.info()


@router.post("/transfer/start")
async def transfer_start(body: TransferStart, request: Request) -> dict[str, Any]:
    transfers = _transfers(request)
    with _refusals(transfers.state):
        holder = await transfers.start(body.version, body.lease_s, body.wait_s, body.resume)
    return {**transfers.state.info(), "token": holder.token, "lease_s": holder.lease_s}


@router.post("/transfer/update")
async def transfer_update(body: TransferUpdate, request: Request) -> dict[str, Any]:
    from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

    transfers = _transfers(request)
    update = WeightTransferUpdateRequest(update_info=body.update_info)
    with _refusals(transfers.state):
        await transfers.update(body.token, lambda: transfers.engine.update_weights(request=update))
    return transfers.state.info()


@router.post("/transfer/abort")
async def transfer_abort(body: TransferAbort, request: Request) -> dict[str, Any]:
    transfers = _transfers(request)
    return {**transfers.state.info(), "abandoned": await transfers.abort(body.token, body.why[:500])}


@router.post("/transfer/finish")
async def transfer_finish(body: TransferToken, request: Request) -> dict[str, Any]:
    transfers = _transfers(request)
    with _refusals(transfers.state):
        await transfers.finish(body.token)
    return transfers.state.info()
