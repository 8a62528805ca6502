"""The ``grouprl serve`` command: a rollout server (:mod:`grouprl.serve`) on the model ``train`` would load.

    grouprl serve --model smollm2-135m [--port 8000] [--host 127.0.0.1] [--dtype fp32] [--lora_rank 8]
    grouprl serve --config run.yaml --port 8001        the model, precision and LoRA of a run's config
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from grouprl.config import TrainConfig, add_dataclass_arguments, load_config
from grouprl.serve.server.guard import DEFAULT_MAX_BODY_MIB, TOKEN_ENV

EXIT_OK = 0
EXIT_ENGINE_DIED = 3
"""The exit status of a server whose vLLM engine died (a supervisor restarts it)."""
SERVE_KEYS = ("model", "dtype", "rollout_dtype", "lora_rank", "seed", "vllm_kv_cache_gib", "vllm_compile",
              "vllm_gpu_memory_utilization", "rollout_weights_transport")
"""The train keys a server reads (the others are accepted and ignored, so a run's config.yaml works)."""
USAGE = "grouprl serve --model NAME [--port P] [--host ADDR] [--dtype fp32|bf16] [--config YAML] [--key value ...]"


def register(subparsers: Any) -> None:
    """Add ``serve`` to ``grouprl``'s subparsers."""
    serve = subparsers.add_parser(
        "serve", help="serve rollouts: vLLM behind HTTP, with weight pushes from a trainer",
        description="Start a rollout server: vLLM (its CPU build on a CPU, its GPU build on a GPU) serving the model "
        "as grouprl loads it, behind vLLM's HTTP server: prompt token ids in, completion token ids and log-probs "
        "out (POST /inference/v1/generate), new weights from a trainer (POST /grouprl/weights) and the policy "
        "version it holds (GET /grouprl/info). Every route but GET /health asks for the server's token "
        "(Authorization: Bearer). Point a run at it with --rollout_servers HOST:PORT and the token in "
        "GROUPRL_SERVER_TOKEN (docs/servers.md).", usage=USAGE, allow_abbrev=False)
    serve.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    serve.add_argument("--config", metavar="YAML", help="YAML file of train keys: the model, precision and LoRA "
                       "keys are read (the command line wins over it)")
    own = serve.add_argument_group("server options")
    own.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine "
                     "only; 0.0.0.0 for every interface, which needs a token given: --api_key or "
                     f"{TOKEN_ENV}). Plain HTTP: on a network, keep servers on a private one or behind a TLS proxy")
    own.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    own.add_argument("--api_key", metavar="TOKEN", default=None, help="the bearer token every request but GET "
                     f"/health must carry (Authorization: Bearer TOKEN); default: {TOKEN_ENV}, else, on a loopback "
                     "address, a new one written to a file only this user reads (its path is printed). Prefer the "
                     "environment variable: a command line is visible to every user of the machine (ps)")
    own.add_argument("--weights_root", metavar="FOLDER", default=None, help="folder pushes are read from under "
                     "this folder only (symlinks and .. resolved; any other is refused with 403): the trainers' "
                     "rollout_weights_dir. Default: where a trainer writes when rollout_weights_dir is empty, "
                     "/dev/shm, else the system's temporary folder")
    own.add_argument("--max_body_mib", type=float, default=DEFAULT_MAX_BODY_MIB, metavar="MIB", help="largest "
                     f"request body taken, in MiB; a larger one is refused with 413 (default: {DEFAULT_MAX_BODY_MIB})")
    own.add_argument("--max_model_len", type=int, default=None, metavar="N", help="longest prompt + completion in "
                     "tokens (default: the model's context, at most 4096)")
    own.add_argument("--max_rows", type=int, default=64, metavar="N", help="sequences decoded at once, and the "
                     "most rows (prompts x n) one request may ask for; the KV cache is sized to hold them all at "
                     "max_model_len unless vllm_kv_cache_gib says (default: 64)")
    add_dataclass_arguments(serve, TrainConfig, keys=SERVE_KEYS, title="model and precision (train's keys)")
    serve.set_defaults(handler=_serve)


def server_format(config: TrainConfig, model: Any, rows: int) -> str:
    """fp32 or bf16: rollout_dtype, else dtype where they name one, else what dtype auto picks for rollouts
    here (bf16 where this machine's bf16 products are faster; vLLM samples in fp32 or bf16 only)."""
    for key in ("rollout_dtype", "dtype"):
        value = getattr(config, key)
        if value in ("fp32", "bf16"):
            return value
        if key == "rollout_dtype" and value != "auto":
            raise ValueError(f"rollout_dtype={value}: a rollout server samples in fp32 or bf16")
    from grouprl.models.precision import resolve_formats

    picked = resolve_formats("auto", "auto", "auto").rollout
    return picked if picked in ("fp32", "bf16") else "fp32"


def _serve(args: argparse.Namespace, rest: list[str]) -> int:
    config = load_config(TrainConfig, args.config, [*args.overrides, *rest])
    from grouprl.serve.server.guard import server_token
    from grouprl.serve.weights.transport import default_weights_root

    token = server_token(args.api_key, args.host, args.port)  # refused before the model loads
    if args.weights_root is not None and not Path(args.weights_root).is_dir():
        raise ValueError(f"--weights_root {args.weights_root} is not a folder (mount the shared storage first)")
    from grouprl.cli.build import load_model
    from grouprl.serve.server.app import EngineDied, ServeOptions, prepare, run

    model, tokenizer = load_model(config.model, config.seed)
    options = ServeOptions(host=args.host, port=args.port, dtype=server_format(config, model, args.max_rows),
                           max_model_len=args.max_model_len, max_rows=args.max_rows,
                           kv_cache_gib=config.vllm_kv_cache_gib, lora_rank=config.lora_rank or None, seed=config.seed,
                           compiled=config.vllm_compile, gpu_memory_utilization=config.vllm_gpu_memory_utilization,
                           weight_transfer=config.rollout_weights_transport, token=token,
                           weights_root=Path(args.weights_root or default_weights_root()),
                           max_body_mib=args.max_body_mib)
    prepared = prepare(model, tokenizer, options, model_name=config.model)
    del model  # vLLM loads the folder prepare wrote
    try:
        run(prepared)
    except EngineDied as e:
        print(f"grouprl serve: {e}", file=sys.stderr, flush=True)
        return EXIT_ENGINE_DIED
    return EXIT_OK
