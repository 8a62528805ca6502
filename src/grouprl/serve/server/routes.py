"""grouprl's routes on a rollout server's vLLM app (:mod:`grouprl.serve.server.app`):

- ``GET /grouprl/info``: the policy version the server holds (None before the first push; the last one
  completed), whether its weights are that version's (``weights_complete``: false once a collective transfer
  started, until one finishes or a full folder push loads), the LoRA
  adapter's name to put in a request's ``model`` (None: the base weights), the serving format and
  context, and the model's architecture and shapes (a trainer checks its policy against them).
- ``POST /grouprl/weights`` ``{"path": folder, "version": k, "adapter": false}``: load the weights a
  trainer wrote to ``folder`` (:mod:`grouprl.serve.weights.transport`) and label what is sampled from now on with
  ``k``. In order: generation paused once the requests in flight finish (each completion comes from
  one version), the weights reloaded in place (vLLM's ``reload_weights`` from a path) or the adapter
  loaded as a new LoRA request (the previous one removed), the prefix cache emptied (its keys and values
  came from the old weights), vLLM's weight version set to ``k`` (every output then carries it),
  generation resumed. A folder the server cannot see is a 400 that says so (the storage must be shared).
  Before anything is paused the push is checked (:mod:`.pushes`): a folder outside the weights
  root is a 403, one whose files are not the served model's weights a 422, a version not newer than the one
  held a 409 (unless ``"resume": true``: a trainer restarting a run, logged). A reload that fails anyway
  reloads the last complete folder (a 422 that says so); if that fails too, generation answers 503 naming why
  until a complete push loads.
- ``POST /grouprl/transfer/{init,start,update,finish,abort,shutdown}``: the same load over vLLM's weight transfer
  (a server started with one: ``nccl`` or ``gloo``), the four calls of vLLM's trainer engine
  (:mod:`grouprl.serve.client.collective`) on vLLM's engine client as its own RL routes make them, with this
  server's order around them: ``init`` joins the trainer's group (``{"init_info": ...}``); ``start``
  (``{"version": k, "lease_s": s, "wait_s": w, "resume": false}``: a version not newer than the one held is a
  409 unless ``resume``) takes the weights lock (waiting at most ``w`` s), pauses generation once the requests
  in flight finish, starts the update and answers a ``token``; ``update``
  (``{"token": t, "update_info": ...}``) receives the broadcast; ``finish`` (``{"token": t}``) finishes it,
  empties the prefix cache, sets the version and resumes. The transfer is held under a lease of ``s`` seconds
  between the trainer's calls; past it, on a failed update, or at the trainer's ``abort`` (``{"token": t,
  "why": ...}``: it cannot complete the transfer), the server abandons it and resumes, and the late calls get a
  409 (:mod:`grouprl.serve.server.leases`). (vLLM's own routes come only with its development mode, which
  opens arbitrary RPCs.)
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, Field

from grouprl.serve.server.leases import TransferRefused, Transfers
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
    adapter: str | None = None
    """The LoRA request's name in vLLM's model registry (a request's ``model``), None: base weights."""
    adapter_id: int | None = None
    weight_transfer: str | None = None
    """vLLM's weight-transfer backend this server enabled (``--weight-transfer-config``); None: folders only."""
    workers: int = 1
    """vLLM workers (tensor x pipeline x data parallel): each is a rank of a trainer's weight-transfer group."""
    address: str = ""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    weights_complete: bool = True
    """False from a collective transfer's start until a push completes: an abandoned transfer may leave the
    weights half-loaded, those of no version."""
    transfers: Transfers | None = None
    """The collective transfers and their leases (made on the first call, with the engine client)."""
    weights_root: Path | None = None
    """Folder pushes come from under this folder only (None: no folder pushes)."""
    tensors: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """The served model's weights, name -> shape, as its engine folder holds them: what a full push must hold."""
    last_folder: Path | None = None
    """The folder of the last complete weights (the engine folder at start, then each full folder push; None
    after a collective push): reloaded when a reload fails midway."""
    adapter_version: int | None = None
    """The policy version of the LoRA adapter held (None: none)."""
    broken: str | None = None
    """Why this server's weights are neither the last complete ones nor a new version's (a reload failed and so
    did the reload of the last complete folder): generation answers 503 until a complete push loads."""

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
    """A folder under this server's weights root: ``model.safetensors`` (full) or a peft adapter (``adapter``)."""
    version: int
    """The policy version these weights are (what the trainer's optimizer steps have made of them)."""
    adapter: bool = False
    resume: bool = False
    """The trainer restarts a run: this version may be older than the one held."""


@router.get("/info")
async def info(request: Request) -> dict[str, Any]:
    return request.app.state.grouprl.info()


def _checked_folder(state: ServerState, body: LoadWeights) -> Path:
    """The push's folder, resolved, once it passed every check that needs no lock (:mod:`.pushes`)."""
    try:
        folder = within_root(body.path, state.weights_root)
        if not folder.is_dir():
            raise PushRefused(HTTPStatus.BAD_REQUEST, f"cannot see the weights folder {body.path}: trainer and "
                              "server need shared storage (weights_dir)")
        if body.adapter:
            check_adapter(folder, state.tensors, state.lora_rank)
        else:
            check_full(folder, state.tensors)
    except PushRefused as e:
        raise HTTPException(e.status, f"this server ({state.address}): {e.message}") from e
    return folder


def _forward_only(state: ServerState, version: int, resume: bool, adapter: bool) -> None:
    """The version rule (:func:`~grouprl.serve.server.pushes.version_refusal`); a resume that moves back is logged. The
    first adapter may carry its base weights' version; each later one must be newer than the last."""
    first_adapter = adapter and state.adapter_version is None
    held = state.adapter_version if adapter and not first_adapter else state.version
    what = "adapter" if adapter and not first_adapter else "weights"
    refusal = version_refusal(held, version, resume, what, equal_ok=first_adapter)
    if refusal:
        raise HTTPException(HTTPStatus.CONFLICT, f"this server ({state.address}): {refusal}")
    if resume and held is not None and version <= held:
        print(f"grouprl serve: version {version} accepted after version {held}: its trainer resumes a run", flush=True)


@router.post("/weights")
async def load_weights(body: LoadWeights, request: Request) -> dict[str, Any]:
    state: ServerState = request.app.state.grouprl
    engine = request.app.state.engine_client
    folder = _checked_folder(state, body)
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
    """Reload the full weights of ``folder`` in place; if that fails midway, the last complete folder again, or
    the server is :attr:`~ServerState.broken`."""
    state.weights_complete = False  # until the reload is whole
    try:
        await engine.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
    except Exception as e:  # noqa: BLE001 - answered below, after the last complete weights are back
        failure = f"the weights in {folder} did not load ({type(e).__name__}: {str(e)[:300]})"
        last = state.last_folder
        try:
            if last is None or not last.is_dir():
                raise FileNotFoundError(f"the last complete folder {last} is gone" if last else
                                        "the last complete weights came over a transfer, not from a folder")
            await engine.collective_rpc("reload_weights", kwargs={"weights_path": str(last)})
        except Exception as again:  # noqa: BLE001 - the server stops generating, saying why
            state.broken = f"{failure}, nor did the last complete weights ({type(again).__name__}: {str(again)[:200]})"
            print(f"grouprl serve: {state.broken}; generation refused until a complete push", flush=True)
            raise HTTPException(HTTPStatus.SERVICE_UNAVAILABLE, f"this server ({state.address}): {state.broken}") from e
        state.weights_complete, state.broken = True, None
        print(f"grouprl serve: {failure}; reloaded the last complete weights (version {state.version})", flush=True)
        raise HTTPException(HTTPStatus.UNPROCESSABLE_ENTITY, f"this server ({state.address}): {failure}; it "
                            f"serves its last complete weights again (version {state.version})") from e
    state.weights_complete, state.broken, state.last_folder = True, None, folder


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
    """vLLM's worker init info for the backend (rendezvous address and port, group size, rank offset)."""


class TransferStart(BaseModel):
    version: int
    lease_s: float = Field(gt=0, allow_inf_nan=False)
    """Seconds the server waits for the trainer's next call (from the end of its last) before it abandons the
    transfer: the trainer's rollout_server_timeout."""
    wait_s: float = Field(ge=0, allow_inf_nan=False)
    """Seconds this start may wait for the weights lock another transfer or load holds."""
    resume: bool = False
    """The trainer restarts a run: this version may be older than the one held."""


class TransferToken(BaseModel):
    token: str
    """What this transfer's start answered."""


class TransferAbort(TransferToken):
    why: str = ""
    """What the trainer could not do (logged with the abandonment)."""


class TransferUpdate(TransferToken):
    update_info: dict[str, Any] | list[dict[str, Any]]
    """vLLM's update info: the names, dtypes and shapes of the tensors the broadcast carries."""


def _transfer(request: Request) -> tuple[ServerState, Any]:
    state: ServerState = request.app.state.grouprl
    if state.weight_transfer is None:
        raise HTTPException(HTTPStatus.BAD_REQUEST, f"this server ({state.address}) was started without a weight "
                            "transfer: start it with --rollout_weights_transport nccl (GPU) or gloo")
    return state, request.app.state.engine_client


def _transfers(request: Request) -> Transfers:
    state, engine = _transfer(request)
    if state.transfers is None:
        state.transfers = Transfers(state, engine)
    return state.transfers


def init_info_problem(backend: str, init_info: dict[str, Any]) -> str | None:
    """Why ``init_info`` is not init info of vLLM's ``backend`` engine (missing or unknown fields), told here:
    once inside vLLM's workers the same mistake is an internal error (a 500), not a bad request."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    import grouprl.serve.weights.gloo  # noqa: F401 - its import registers the gloo backend in this process too

    engine_class = WeightTransferEngineFactory._registry.get(backend)
    if engine_class is None:
        return None
    try:
        engine_class().init_info_cls(**init_info)
    except (TypeError, ValueError) as e:
        return f"init_info is not the {backend} weight transfer's: {e}"
    return None


@router.post("/transfer/init")
async def transfer_init(body: TransferInit, request: Request) -> dict[str, Any]:
    from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

    state, engine = _transfer(request)
    if (problem := init_info_problem(state.weight_transfer, body.init_info)) is not None:
        raise HTTPException(HTTPStatus.UNPROCESSABLE_ENTITY, problem)
    await engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=body.init_info))
    return state.info()


@router.post("/transfer/shutdown")
async def transfer_shutdown(request: Request) -> dict[str, Any]:
    state, engine = _transfer(request)
    await engine.shutdown_weight_transfer_engine()
    return state.info()


@router.post("/transfer/start")
async def transfer_start(body: TransferStart, request: Request) -> dict[str, Any]:
    transfers = _transfers(request)
    try:
        holder = await transfers.start(body.version, body.lease_s, body.wait_s, body.resume)
    except TransferRefused as e:
        raise HTTPException(HTTPStatus.CONFLICT, f"this server ({transfers.state.address}): {e}") from e
    return {**transfers.state.info(), "token": holder.token, "lease_s": holder.lease_s}


@router.post("/transfer/update")
async def transfer_update(body: TransferUpdate, request: Request) -> dict[str, Any]:
    from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

    transfers = _transfers(request)
    update = WeightTransferUpdateRequest(update_info=body.update_info)
    try:
        await transfers.update(body.token, lambda: transfers.engine.update_weights(request=update))
    except TransferRefused as e:
        raise HTTPException(HTTPStatus.CONFLICT, f"this server ({transfers.state.address}): {e}") from e
    return transfers.state.info()


@router.post("/transfer/abort")
async def transfer_abort(body: TransferAbort, request: Request) -> dict[str, Any]:
    transfers = _transfers(request)
    return {**transfers.state.info(), "abandoned": await transfers.abort(body.token, body.why[:500])}


@router.post("/transfer/finish")
async def transfer_finish(body: TransferToken, request: Request) -> dict[str, Any]:
    transfers = _transfers(request)
    try:
        await transfers.finish(body.token)
    except TransferRefused as e:
        raise HTTPException(HTTPStatus.CONFLICT, f"this server ({transfers.state.address}): {e}") from e
    return transfers.state.info()
