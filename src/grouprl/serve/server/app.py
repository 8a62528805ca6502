"""A rollout server: vLLM's HTTP server with grouprl's routes, behind :mod:`.guard`, on the model written once in the
serving format. On a CPU: eager unless compiled, no chunked prefill (vLLM cannot rewind a seeded CPU generator)."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from grouprl.rollout.engines import model_problem, plain_class_name, require_vllm
from grouprl.rollout.scratch import ScratchFolder
from grouprl.rollout.vllm import kv_cache_bytes
from grouprl.serve.client.servers import SERVER_KEEP_ALIVE_S
from grouprl.serve.server.guard import DEFAULT_MAX_BODY_MIB, Guard
from grouprl.serve.server.parent import watch_parent
from grouprl.serve.server.pushes import read_header
from grouprl.serve.server.routes import ServerState, router
from grouprl.serve.weights.transport import WEIGHTS_FILE, reading, server_transport, write_model_folder

FORMATS = {"fp32": "float32", "bf16": "bfloat16"}  # grouprl's name -> vLLM's
SERVED_NAME = "policy"  # the ``model`` of a request without a LoRA adapter
DEFAULT_MAX_MODEL_LEN = 4096


@dataclass
class ServeOptions:
    """Where a server listens and how vLLM is sized."""

    host: str = "127.0.0.1"
    port: int = 8000
    dtype: str = "fp32"
    max_model_len: int | None = None  # None: the model's context, at most DEFAULT_MAX_MODEL_LEN
    max_rows: int = 64  # sequences decoded at once; the default KV cache holds them all at their longest
    kv_cache_gib: float | None = None
    lora_rank: int | None = None  # serve LoRA adapters of up to this rank; None: full weights only
    seed: int = 0
    compiled: bool = False
    gpu_memory_utilization: float = 0.9
    weight_transfer: str = "auto"  # how trainers may send weights besides folders
    token: str = field(default="", repr=False)
    weights_root: Path | None = None  # folder pushes are read from under it only; None: none
    max_body_mib: float = DEFAULT_MAX_BODY_MIB

    def __post_init__(self) -> None:
        if self.dtype not in FORMATS:
            raise ValueError(f"a rollout server samples in {' or '.join(FORMATS)}, not dtype={self.dtype!r}")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {self.max_rows}")
        if self.max_body_mib <= 0:
            raise ValueError(f"max_body_mib must be > 0, got {self.max_body_mib}")
        if self.weights_root is not None and not Path(self.weights_root).is_dir():
            raise ValueError(f"weights_root {self.weights_root} is not a folder")
        server_transport(self.weight_transfer, torch.cuda.is_available())  # a bad choice named before any work


def context_of(model: nn.Module, requested: int | None) -> int:
    context = getattr(model.config, "max_position_embeddings", None)
    if requested is None:
        return min(int(context or DEFAULT_MAX_MODEL_LEN), DEFAULT_MAX_MODEL_LEN)
    if context is not None and requested > context:
        raise ValueError(f"max_model_len={requested} is longer than the model's context of {context} tokens")
    return requested


def engine_argv(folder: Path, options: ServeOptions, max_model_len: int, kv_bytes: int, on_gpu: bool) -> list[str]:
    o = options
    transport = server_transport(o.weight_transfer, on_gpu)
    argv = ["--model", str(folder), "--tokenizer", str(folder), "--served-model-name", SERVED_NAME,
            "--load-format", "safetensors", "--dtype", FORMATS[o.dtype], "--seed", str(o.seed),
            "--max-model-len", str(max_model_len), "--logprobs-mode", "processed_logprobs",
            "--enable-prefix-caching", "--enable-scale-out", "--max-num-seqs", str(max(o.max_rows, 1)),
            "--host", o.host, "--port", str(o.port), "--disable-uvicorn-access-log"]
    if on_gpu:
        argv += ["--gpu-memory-utilization", str(o.gpu_memory_utilization)]
    else:
        argv += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(max_model_len, 8192)),
                 "--kv-cache-memory-bytes", str(kv_bytes)]
        if not o.compiled:
            argv.append("--enforce-eager")
    if o.lora_rank:  # vLLM takes a few fixed maximum ranks: the next power of two, at least 8
        rank = max(8, 1 << (o.lora_rank - 1).bit_length())
        argv += ["--enable-lora", "--max-loras", "1", "--max-lora-rank", str(rank)]
    if transport.backend is not None:
        argv += ["--weight-transfer-config", json.dumps({"backend": transport.backend}), *transport.server_argv]
    return argv


class EngineDied(RuntimeError):
    """vLLM's engine died and its HTTP server shut down: the server failed (its process exits non-zero)."""


async def _serve(argv: list[str], state: ServerState, options: ServeOptions) -> None:
    """vLLM's ``run_server`` with grouprl's routes and guard; :class:`EngineDied` where vLLM returns as from a normal
    stop because its engine died."""
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.launchers.launcher import serve_http, setup_server
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    validate_parsed_serve_args(args)
    listen_address, sock = setup_server(args, reuse_port=False)
    async with build_async_engine_client(args) as engine:
        tasks = await engine.get_supported_tasks()
        app = build_app(args, tasks, engine.model_config)
        app.include_router(router)
        # outermost, around the stack vLLM's app has already built (so add_middleware is closed)
        app.middleware_stack = Guard(app.middleware_stack or app.build_middleware_stack(), token=options.token,
                                     state=state, max_rows=max(options.max_rows, 1),
                                     max_body_bytes=int(options.max_body_mib * 2**20))
        app.state.grouprl = state
        await init_app_state(engine, app.state, args, tasks)
        state.address = listen_address
        state.workers = int(engine.vllm_config.parallel_config.world_size_across_dp)
        print(f"grouprl serve: {state.describe()} on {listen_address}", flush=True)
        shutdown = await serve_http(app, sock=sock, host=args.host, port=args.port, log_level="warning",
                                    access_log=False, timeout_keep_alive=SERVER_KEEP_ALIVE_S)
        # vLLM 0.32: a signal stops the engine, then cancels the HTTP server and returns its shutdown; the HTTP
        # server ending by itself (its watchdog, or a request's handler, found the engine dead) returns a no-op
        died = getattr(shutdown, "__name__", "") == "dummy_shutdown" and engine.errored
        error = getattr(engine, "dead_error", None) if died else None
        cause = getattr(error, "__cause__", None)
    try:
        await shutdown
    finally:
        sock.close()
    if died:
        said = f"{type(error).__name__}: {error}" if error is not None else "no reason given"
        said += f", caused by {type(cause).__name__}: {cause}" if cause is not None else ""
        raise EngineDied(f"vLLM's engine died ({said}); the server stopped")


@dataclass
class Prepared:
    """A server ready to start: its engine folder (removed by :func:`run`) and vLLM's arguments."""

    folder: ScratchFolder
    argv: list[str]
    state: ServerState
    options: ServeOptions


def model_facts(model: nn.Module) -> dict[str, Any]:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return {"architecture": plain_class_name(model), "vocab_size": int(config.vocab_size),
            "hidden_size": int(config.hidden_size), "num_hidden_layers": int(config.num_hidden_layers)}


def prepare(model: nn.Module, tokenizer: Any, options: ServeOptions, model_name: str = "") -> Prepared:
    """Check that vLLM can serve ``model`` here and write its engine folder (the model is not needed after)."""
    if len(options.token) < 16:
        raise ValueError("a rollout server needs a token of at least 16 characters (guard.server_token)")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    require_vllm()
    problem = model_problem(model)
    if problem:
        raise ValueError(f"grouprl serve: {problem}")
    length = context_of(model, options.max_model_len)
    dtype = getattr(torch, FORMATS[options.dtype])
    kv = int(options.kv_cache_gib * 2**30) if options.kv_cache_gib else kv_cache_bytes(model, options.max_rows,
                                                                                      length, dtype)
    folder = ScratchFolder("grouprl-serve-")
    try:
        write_model_folder(model, tokenizer, folder.path, reading(model, dtype=dtype))
    except BaseException:
        folder.remove()
        raise
    cuda = torch.cuda.is_available()
    state = ServerState(model=model_name or str(folder.path), dtype=options.dtype, max_model_len=length,
                        lora_rank=options.lora_rank, facts=model_facts(model),
                        weight_transfer=server_transport(options.weight_transfer, cuda).backend,
                        weights_root=Path(options.weights_root).resolve() if options.weights_root else None,
                        tensors=read_header(folder.path / WEIGHTS_FILE))
    return Prepared(folder, engine_argv(folder.path, options, length, kv, cuda), state, options)


def run(prepared: Prepared) -> None:
    """Serve until SIGINT, SIGTERM or the end of the run that started it, then remove the engine folder."""
    watch_parent()
    try:
        asyncio.run(_serve(prepared.argv, prepared.state, prepared.options))
    finally:
        prepared.folder.remove()
