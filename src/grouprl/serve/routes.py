"""grouprl's routes on a rollout server's vLLM app (:mod:`grouprl.serve.server`):

- ``GET /grouprl/info``: the policy version the server holds (None before the first push), the LoRA
  adapter's name to put in a request's ``model`` (None: the base weights), the serving format and
  context, and the model's architecture and shapes (a trainer checks its policy against them).
- ``POST /grouprl/weights`` ``{"path": folder, "version": k, "adapter": false}``: load the weights a
  trainer wrote to ``folder`` (:mod:`grouprl.serve.transport`) and label what is sampled from now on with
  ``k``. In order: generation paused once the requests in flight finish (each completion comes from
  one version), the weights reloaded in place (vLLM's ``reload_weights`` from a path) or the adapter
  loaded as a new LoRA request (the previous one removed), the prefix cache emptied (its keys and values
  came from the old weights), vLLM's weight version set to ``k`` (every output then carries it),
  generation resumed. A folder the server cannot see is a 400 that says so (the storage must be shared).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel

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
    address: str = ""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def describe(self) -> str:
        lora = f", LoRA up to rank {self.lora_rank}" if self.lora_rank else ""
        return f"{self.model} in {self.dtype}{lora}, up to {self.max_model_len} tokens a sequence"

    def info(self) -> dict[str, Any]:
        return {"version": self.version, "adapter": self.adapter, "model": self.model, "dtype": self.dtype,
                "max_model_len": self.max_model_len, "lora_rank": self.lora_rank, "facts": self.facts}


class LoadWeights(BaseModel):
    path: str
    """A folder this server can read: ``model.safetensors`` (full) or a peft adapter (``adapter``)."""
    version: int
    """The policy version these weights are (what the trainer's optimizer steps have made of them)."""
    adapter: bool = False


@router.get("/info")
async def info(request: Request) -> dict[str, Any]:
    return request.app.state.grouprl.info()


@router.post("/weights")
async def load_weights(body: LoadWeights, request: Request) -> dict[str, Any]:
    state: ServerState = request.app.state.grouprl
    engine = request.app.state.engine_client
    folder = Path(body.path)
    if not folder.is_dir():
        raise HTTPException(HTTPStatus.BAD_REQUEST, f"this server ({state.address}) cannot see the weights folder "
                            f"{body.path}: trainer and server need shared storage (weights_dir)")
    if body.adapter and not state.lora_rank:
        raise HTTPException(HTTPStatus.BAD_REQUEST, "a LoRA adapter was sent to a server started without "
                            "--lora_rank: start it with the trainer's lora_rank")
    start = time.perf_counter()
    async with state.lock:
        await engine.pause_generation(mode="wait")
        try:
            if body.adapter:
                await _load_adapter(request, state, str(folder), body.version)
            else:
                await engine.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
            await engine.reset_prefix_cache()
            await engine.update_weight_version(str(body.version))
            state.version = body.version
        finally:
            await engine.resume_generation()
    return {**state.info(), "seconds": time.perf_counter() - start}


async def _load_adapter(request: Request, state: ServerState, path: str, version: int) -> None:
    from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest

    models = request.app.state.openai_serving_models
    name = f"policy-v{version}"
    loaded = await models.load_lora_adapter(LoadLoRAAdapterRequest(lora_name=name, lora_path=path))
    if not isinstance(loaded, str):  # vLLM's ErrorResponse
        raise HTTPException(HTTPStatus.INTERNAL_SERVER_ERROR, f"the adapter in {path} did not load: {loaded}")
    old, old_id = state.adapter, state.adapter_id
    state.adapter, state.adapter_id = name, models.lora_requests[name].lora_int_id
    if old is not None and old != name:
        await models.unload_lora_adapter(UnloadLoRAAdapterRequest(lora_name=old))
        await request.app.state.engine_client.remove_lora(old_id)
