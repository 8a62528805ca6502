"""How weights travel from the trainer to rollout servers (:data:`TRANSPORTS`): safetensors folders both sides see,
one per policy version, renamed whole once written so a server never reads half a file (a LoRA push: peft's adapter
folder); or a broadcast (nccl, gloo: :mod:`grouprl.serve.client.collective`)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grouprl.errors import ConfigError
from grouprl.registry import Registry
from grouprl.rollout.scratch import ScratchFolder
from grouprl.serve.client.servers import RolloutServerError
from grouprl.serve.weights.stream_write import Entry, aligned, write_streamed

WEIGHTS_FILE = "model.safetensors"


def default_weights_root() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


@dataclass
class Reading:
    """One version of the policy's weights: ``entries`` in the order ``tensors`` yields them, each read whole as it
    is taken (under FSDP a gather every process joins, so a reading is read to its end)."""

    entries: list[Entry]
    tensors: Iterator[tuple[str, torch.Tensor]]

    def drain(self) -> None:
        for _ in self.tensors:
            pass

    @contextlib.contextmanager
    def through(self) -> Iterator[Reading]:
        """The rest is read after the block, after an error too (others wait in a gather), not after an interrupt."""
        try:
            yield self
        except Exception:
            self.drain()
            raise
        self.drain()


def reading(model: Any, keep: Callable[[str], bool] = lambda name: True, dtype: torch.dtype | None = None) -> Reading:
    """The entries of ``model``'s state dict that ``keep`` accepts, whole, floating ones in ``dtype`` (None: as they
    are), in a weights file's order."""
    from grouprl.rollout.vllm_weights import whole

    state = model.state_dict()
    entries = aligned(Entry(n, tuple(t.shape), dtype if dtype is not None and t.is_floating_point() else t.dtype)
                      for n, t in state.items() if keep(n))
    return Reading(entries, ((e.name, whole(state[e.name], None)) for e in entries))


def plain_name(model: Any) -> Callable[[str], str | None]:
    """State-dict name -> the plain model's name (None for a LoRA adapter's tensors)."""
    if not hasattr(model, "peft_config"):
        return lambda name: name
    from grouprl.rollout.vllm_weights import base_weight_name

    return base_weight_name


def write_weights_file(model: Any, read: Reading, folder: Path, adapters: dict[str, torch.Tensor] | None = None
                       ) -> int:
    """``folder/model.safetensors``: the plain model's weights of ``read`` (a tied head under each of its names: vLLM's
    CPU build reloads its head only from ``lm_head.weight``); adapters go into ``adapters``. The bytes written."""
    plain = plain_name(model)
    entries = [dataclasses.replace(e, name=name) for e in read.entries if (name := plain(e.name)) is not None]

    def named() -> Iterator[tuple[str, torch.Tensor]]:
        for n, t in read.tensors:
            name = plain(n)
            if name is not None:
                yield name, t
            elif adapters is not None and ".lora_" in n:
                adapters[n] = t.to("cpu")
            del t  # not held while the next one is read

    folder.mkdir(parents=True, exist_ok=True)
    return write_streamed(folder / WEIGHTS_FILE, entries, named(), {"format": "pt"})


def is_sharded(model: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def write_model_folder(model: Any, tokenizer: Any, folder: Path, read: Reading) -> None:
    """A model folder that ``transformers`` and vLLM both load."""
    from grouprl.rollout.engines import plain_class_name

    with read.through():
        inner = model.get_base_model() if hasattr(model, "peft_config") else model
        config = inner.config.__class__.from_dict(inner.config.to_dict())
        config.architectures = [plain_class_name(inner)]
        config.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        write_weights_file(model, read, folder)


class WeightFolders:
    """Versioned push folders under a scratch folder in ``root`` (gone with the trainer, a killed one too)."""

    def __init__(self, root: str | Path | None = None):
        base = Path(root) if root is not None else default_weights_root()
        base.mkdir(parents=True, exist_ok=True)
        self.scratch = ScratchFolder("grouprl-weights-", base)
        self.root = self.scratch.path

    def path(self, version: int, adapter: bool = False) -> Path:
        return self.root / (f"v{version}-lora" if adapter else f"v{version}")

    def write_full(self, model: Any, read: Reading, version: int, adapters: dict[str, torch.Tensor] | None = None
                   ) -> Path:
        return self._publish(self.path(version), lambda tmp: write_weights_file(model, read, tmp, adapters))

    def write_adapter(self, model: Any, state: dict[str, torch.Tensor], version: int) -> Path:
        return self._publish(self.path(version, adapter=True), lambda tmp: model.save_pretrained(str(tmp),
                                                                                                   state_dict=state))

    def _publish(self, path: Path, write: Any) -> Path:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=self.root))
        try:
            write(tmp)
            os.replace(tmp, path)  # a server sees the folder whole or not at all
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return path

    def keep_only(self, *paths: Path) -> None:
        keep = {p.name for p in paths}
        for entry in self.root.iterdir():
            if entry.name not in keep:
                shutil.rmtree(entry, ignore_errors=True)

    def remove(self) -> None:
        self.scratch.remove()


class FileWeights:
    """The trainer's side of the ``files`` transport: each version written once, then loaded by every server (LoRA:
    the base once, then the adapter alone), and removed once every server holds it."""

    def __init__(self, pool: Any, lora: bool, weights_dir: str | None):
        for s in pool.alive:
            if lora and not s.info.get("lora_rank"):
                raise RolloutServerError(f"rollout server {s.address} was started without --lora_rank and the "
                                         "policy has LoRA adapters: start it with the run's lora_rank")
        self.pool, self.lora = pool, lora
        self.folders = WeightFolders(weights_dir)
        self.staged: dict[bool, Path] = {}  # adapter? -> a folder written and not yet loaded by the servers
        self.base_written, self.version = False, 0
        self.resume = True  # the first push may go back: a server of an earlier run takes the version we resume from

    def write(self, model: Any, read: Reading, version: int, dtype: torch.dtype) -> None:
        adapters: dict[str, torch.Tensor] = {}
        if not self.lora or not self.base_written:
            # under LoRA the base goes under the plain model's names; the adapters follow as a LoRA request
            self.staged[False] = self.folders.write_full(model, read, version, adapters)
            self.base_written = True
        else:
            adapters = {n: t.to("cpu") for n, t in read.tensors}
        if self.lora:
            self.staged[True] = self.folders.write_adapter(model, adapters, version)
        self.version = version

    def push(self) -> None:
        for adapter, path in self.staged.items():  # the base before the adapter
            self.pool.run(self.pool.everywhere(lambda server, a=adapter, p=path: self._load(server, a, p,
                                                                                            self.version)))
        self.staged.clear()
        self.resume = False
        self.folders.keep_only()  # the servers hold the weights now: the folders' memory back

    async def _load(self, server: Any, adapter: bool, path: Path, version: int) -> None:
        body = {"path": str(path), "version": version, "adapter": adapter, "resume": self.resume}
        answer = await self.pool.request(server, "POST", "/grouprl/weights", body)
        server.version, server.adapter = answer.get("version"), answer.get("adapter")

    def close(self) -> None:
        self.folders.remove()


def vllm_has(module: str) -> bool:
    """Whether the installed vLLM has ``module`` (a path under its package), without importing vLLM."""
    spec = importlib.util.find_spec("vllm")
    return spec is not None and any((Path(p) / module).is_file() for p in spec.submodule_search_locations or [])


def _needs_vllm(device: torch.device | None, engines: str = "weight-transfer engines") -> str | None:
    if not vllm_has("distributed/weight_transfer/nccl_engine.py"):
        return f"vLLM with its {engines} (vllm.distributed.weight_transfer) is not installed here"
    return None


def _needs_cuda(device: torch.device | None) -> str | None:
    if device is None or device.type != "cuda":
        return f"the policy is on {device or 'the CPU'}, not a CUDA device"
    return _needs_vllm(device, "NCCL weight-transfer engine")


def _nccl_info(host: str, port: int, world_size: int, timeout: float) -> Any:
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

    return NCCLTrainerInitInfo(master_address=host, master_port=port, world_size=world_size, rank=0)


def _gloo_info(host: str, port: int, world_size: int, timeout: float) -> Any:
    from grouprl.serve.weights.gloo import GlooTrainerInitInfo  # its import registers the backend with vLLM

    return GlooTrainerInitInfo(master_address=host, master_port=port, world_size=world_size, rank=0, timeout_s=timeout)


@dataclass(frozen=True)
class Transport:
    """One way weights travel: vLLM's weight-transfer ``backend`` the servers start with (None: folders only), why a
    policy on a device cannot send this way (``problem``, None: it can), and the trainer's sender made from the
    :class:`~grouprl.serve.client.handover.WeightHandover` and the timeout (``init_info``: a collective's)."""

    backend: str | None
    problem: Callable[[torch.device | None], str | None]
    init_info: Callable[[str, int, int, float], Any] | None = None
    server_argv: tuple[str, ...] = ()

    def sender(self, handover: Any, timeout: float) -> Any:
        if self.init_info is None:
            return FileWeights(handover.pool, handover.lora, handover.weights_dir)
        from grouprl.serve.client.collective import CollectiveWeights

        return CollectiveWeights(handover.pool, self.backend, self.init_info, timeout, handover.pool.setting,
                                 stages=lambda: handover.stages_pushes)

    def keep(self, lora: bool, first: bool) -> Callable[[str], bool]:
        """Which entries of the policy's state dict a push reads: with files and LoRA, the adapters after the first."""
        if lora and self.backend is None and not first:
            return lambda name: ".lora_" in name
        return lambda name: True


TRANSPORTS: Registry[Transport] = Registry("rollout weights transport")
TRANSPORTS.register("files", Transport(None, lambda device: None))  # safetensors folders on shared storage
TRANSPORTS.register("nccl", Transport("nccl", _needs_cuda, _nccl_info))  # from the trainer's GPU to the servers'
TRANSPORTS.register("gloo", Transport("gloo", _needs_vllm, _gloo_info,  # over TCP, no GPU needed
                                      # imported in each worker process, it registers the backend there
                                      ("--worker-extension-cls", "grouprl.serve.weights.gloo.GlooWorkerExtension")))
SETTING = "rollout_weights_transport"


def resolve_transport(requested: str, device: torch.device | None, local_servers: bool = False) -> tuple[str, str]:
    """(transport name, why): auto is nccl where it can run (not with ``local_servers``: NCCL takes one rank per GPU),
    else files; a named one that cannot run is a ConfigError."""
    shared = "the servers started here share the trainer's GPU, and NCCL takes one rank per GPU"
    if requested == "auto":
        problem = TRANSPORTS.get("nccl").problem(device) or (shared if local_servers else None)
        if problem is None:
            return "nccl", f"auto: the policy is on {device} and vLLM's NCCL weight transfer is installed"
        return "files", f"auto: {problem}"
    if requested not in TRANSPORTS:
        raise ConfigError(f"{SETTING}={requested!r}: choose auto, {', '.join(TRANSPORTS.names())}")
    problem = TRANSPORTS.get(requested).problem(device)
    if requested == "nccl" and local_servers:
        problem = f"{shared}; start grouprl serve on other GPUs (CUDA_VISIBLE_DEVICES) and give rollout_servers " \
                  "their addresses"
    if problem is not None:
        raise ConfigError(f"{SETTING}={requested}: {problem}; use {SETTING}=files (or auto)")
    return requested, f"{SETTING}={requested}"


def server_transport(requested: str, cuda: bool) -> Transport:
    """The transport a server enables besides folders: auto is nccl on a GPU, gloo on a CPU."""
    if requested == "auto":
        requested = "nccl" if cuda else "gloo"
    if requested not in TRANSPORTS:
        raise ValueError(f"{SETTING}={requested!r}: choose auto, {', '.join(TRANSPORTS.names())}")
    if requested == "nccl" and not cuda:
        raise ValueError(f"{SETTING}=nccl: this server has no CUDA device; use gloo (or files) on a CPU")
    return TRANSPORTS.get(requested)
