"""The ``servers`` rollout engine of a run (:mod:`.rollout_plan`): the addresses ``rollout_servers`` gives, or N
servers started here on the policy (:mod:`.local_servers`), told the run's format, LoRA rank, seed, longest sequence
and rows. Of several trainer processes, process 0 alone starts them and every process samples from them."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from grouprl.errors import ConfigError
from grouprl.rollout.scratch import ScratchFolder
from grouprl.serve.client.pool import ServerPool
from grouprl.serve.client.ranks import Ranks
from grouprl.serve.client.server_sampler import ServerSampler
from grouprl.serve.client.servers import parse_address
from grouprl.serve.server.guard import TOKEN_ENV
from grouprl.serve.weights.transport import Reading, default_weights_root, is_sharded, reading, write_model_folder
from grouprl.trainer.dist.group import gather_objects, raise_if_any_failed
from grouprl.trainer.local_servers import LocalServers

if TYPE_CHECKING:
    from grouprl.trainer.config import TrainerConfig


def server_problems(servers: Any, timeout: float) -> list[str]:
    """What is wrong with ``rollout_servers`` and ``rollout_server_timeout`` (empty when usable), asking no server."""
    out = []
    if timeout <= 0:
        out.append(f"rollout_server_timeout must be > 0 seconds, got {timeout}")
    if isinstance(servers, int) and not isinstance(servers, bool):
        if servers < 1:
            out.append(f"rollout_servers={servers}: start at least 1 local server, or leave it empty")
    elif servers is not None:
        for address in servers:
            try:
                parse_address(address)
            except ValueError as e:
                out.append(str(e))
    return out


def serve_options(config: TrainerConfig, max_model_len: int, transport: str = "files") -> list[str]:
    """``grouprl serve`` arguments for a local server that samples as the run does."""
    c = config
    options = ["--rollout_dtype", "bf16" if c.rollout_bf16 else "fp32", "--seed", str(c.seed),
               "--max_model_len", str(max_model_len), "--max_rows", str(c.rollout_rows),
               "--rollout_weights_transport", transport]
    if c.lora_rank:
        options += ["--lora_rank", str(c.lora_rank)]
    if c.vllm_kv_cache_gib:
        options += ["--vllm_kv_cache_gib", str(c.vllm_kv_cache_gib)]
    if c.vllm_compile:
        options += ["--vllm_compile", "true"]
    return options


def server_sampler(config: TrainerConfig, policy: nn.Module, tokenizer: Any, max_model_len: int,
                   transport: str = "files") -> ServerSampler:
    """The run's :class:`ServerSampler`; local servers are started first (by process 0 of several), from the policy
    written to a folder removed once they are up; a process that cannot reach the servers stops every one."""
    c, ranks, local, folder, down = config, Ranks.current(), None, None, {}
    addresses, token = c.rollout_servers, c.rollout_server_token or os.environ.get(TOKEN_ENV)
    if isinstance(addresses, int):
        addresses, down, local, folder, token = _start_local(c, policy, tokenizer, max_model_len, transport, ranks)
    sampler, error = None, None
    try:
        sampler = ServerSampler(policy, tokenizer, list(addresses), timeout=c.rollout_server_timeout,
                                weights_dir=c.rollout_weights_dir, local=local, transport=transport,
                                down=down, token=token or "")
    except Exception as e:  # noqa: BLE001 - raised below (in every process, with several)
        error = e
    finally:
        if folder is not None:  # the servers are up (or gone): the folder they started from is not needed
            folder.remove()
    try:
        if ranks is not None:
            raise_if_any_failed(error)
        elif error is not None:
            raise error
    except BaseException:
        if sampler is not None:
            sampler.close()
        elif local is not None:
            local.stop()
        raise
    return sampler


def _start_local(c: TrainerConfig, policy: nn.Module, tokenizer: Any, max_model_len: int, transport: str,
                 ranks: Ranks | None
                 ) -> tuple[list[str], dict[str, str], LocalServers | None, ScratchFolder | None, str]:
    """``c.rollout_servers`` local servers started on the policy (by process 0 alone): their addresses, those that did
    not come up (address -> why), the servers (None elsewhere), the folder they started from and their token."""
    from grouprl.rollout.engines import model_problem

    problem = model_problem(policy)  # the servers would start, then exit saying so
    if problem is not None:
        raise ConfigError(f"rollout_servers={c.rollout_servers}: {problem}")
    root = Path(c.rollout_weights_dir) if c.rollout_weights_dir else default_weights_root()
    local: LocalServers | None = None
    folder: ScratchFolder | None = None
    failed: Exception | None = None

    def write_policy(read: Reading) -> None:
        nonlocal folder
        with read.through():
            root.mkdir(parents=True, exist_ok=True)
            folder = ScratchFolder("grouprl-policy-", root)  # the whole policy: gone with the run, a killed one too
            write_model_folder(policy, tokenizer, folder.path, read)

    def start() -> tuple[list[str], dict[str, str], str]:
        nonlocal local
        if failed is not None:
            raise failed
        if folder is None:
            write_policy(reading(policy))
        options = serve_options(c, max_model_len, transport)
        local = LocalServers(c.rollout_servers, folder.path, options, Path(c.output_dir) / "servers",
                             weights_root=root)
        # the other processes cannot see a server's process exit: process 0 waits for them to come up and
        # tells which did not (one process waits in its sampler, as for any server)
        return local.addresses, (_not_up(local, c.rollout_server_timeout) if ranks is not None else {}), local.token

    try:
        if ranks is not None and is_sharded(policy):
            # FSDP shards: every process takes part in gathering the policy process 0 writes, before process 0
            # alone starts the servers (its error, raised by start, reaches the others through _from_main)
            if ranks.is_main:
                try:
                    write_policy(reading(policy))
                except Exception as e:  # noqa: BLE001 - raised in start, on every process
                    failed = e
            else:
                reading(policy).drain()
        addresses, down, token = start() if ranks is None else _from_main(start, ranks)
    except BaseException:
        if local is not None:
            local.stop()
        if folder is not None:
            folder.remove()
        raise
    return addresses, down, local, folder, token


def _not_up(local: LocalServers, timeout: float) -> dict[str, str]:
    """Each of ``local``'s servers that did not answer within ``timeout`` (address -> why), or a RolloutServerError
    when none came up."""
    pool = ServerPool(local.addresses, timeout, token=local.token)
    for i, server in enumerate(pool.servers):
        server.describe_exit = lambda settle, i=i: local.describe(i, settle)
    try:
        with warnings.catch_warnings():  # said by every process's sampler, which drops them
            warnings.simplefilter("ignore")
            pool.run(pool.wait_ready())
    finally:
        pool.close()
    return {s.address: s.why for s in pool.servers if not s.alive}


def _from_main(make: Callable[[], Any], ranks: Ranks) -> Any:
    """``make()`` run by process 0, its result in every process (its error raised in every one)."""
    result, error = None, None
    if ranks.is_main:
        try:
            result = make()
        except Exception as e:  # noqa: BLE001 - raised below, in every process
            error = e
    raise_if_any_failed(error)
    return gather_objects(result)[0]
