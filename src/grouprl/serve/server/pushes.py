"""What a rollout server checks of a weight push before vLLM is touched, so a bad push is a 4xx and the server keeps
its last complete weights: the folder lies under the weights root (403: a caller cannot make the server read whatever
it can read); versions only move forward unless the trainer resumes a run (409: a replayed push cannot roll the
policy back); the files are whole safetensors with the served names and shapes, an adapter's rank within
``lora_rank`` (422). No tensor's bytes are read."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from grouprl.serve.server.guard import Refusal
from grouprl.serve.weights.transport import WEIGHTS_FILE

ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
SHOWN = 3


class PushRefused(Refusal):
    """A push refused before it loads."""


def within_root(path: str, root: Path | None) -> Path:
    if root is None:
        raise PushRefused(403, "this server takes no folder pushes: start it with --weights_root FOLDER (the "
                               "trainer's rollout_weights_dir, on storage both see), or push over a weight transfer")
    resolved = Path(path).resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise PushRefused(403, f"the weights folder {path} is outside this server's weights root {root}: a push "
                               "names a folder under it (the trainer's rollout_weights_dir)")
    return resolved


def version_refusal(held: int | None, version: int, resume: bool, what: str = "weights", equal_ok: bool = False,
                    log: Callable[[str], None] = lambda line: print(line, flush=True)) -> str | None:
    """Why a push of ``version`` onto ``held`` is refused (None: taken; a resumed run's step back is logged)."""
    if resume and held is not None and version <= held:
        log(f"grouprl serve: version {version} accepted after version {held}: its trainer resumes a run")
    if held is None or version > held or resume or (equal_ok and version == held):
        return None
    return (f"the push of policy version {version} is not newer than the {what} version {held} this server "
            "holds: versions only move forward (a trainer that restarts a run says so with resume)")


def read_header(file: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of a whole safetensors file (its header checked against its size), else a 422."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), framework="pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118 - not a dict
    except OSError as e:
        raise PushRefused(422, f"{file} cannot be read: {e.strerror or e}") from e
    except SafetensorError as e:  # a cut file says "incomplete metadata, file not fully covered"
        raise PushRefused(422, f"{file} is not a whole safetensors file ({e}): a copy still under way?") from e


def _listed(names: list[str]) -> str:
    return ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def check_full(folder: Path, served: dict[str, tuple[int, ...]]) -> None:
    """A full push: ``folder/model.safetensors`` whole, with exactly the ``served`` tensors' names and shapes."""
    file = folder / WEIGHTS_FILE
    if not file.is_file():
        raise PushRefused(422, f"the weights folder {folder} holds no {WEIGHTS_FILE}")
    pushed = read_header(file)
    missing = sorted(set(served) - set(pushed))
    extra = sorted(set(pushed) - set(served))
    if missing or extra:
        said = "; ".join(part for part in (missing and f"missing {_listed(missing)}",
                                           extra and f"not in the served model: {_listed(extra)}") if part)
        raise PushRefused(422, f"{file} is not the served model's weights: {said}")
    wrong = [f"{n} {list(pushed[n])} (served: {list(served[n])})" for n in sorted(served) if pushed[n] != served[n]]
    if wrong:
        raise PushRefused(422, f"{file} has other shapes than the served model: {_listed(wrong)}")


def check_adapter(folder: Path, served: dict[str, tuple[int, ...]], max_rank: int | None) -> None:
    """A LoRA push: rank ``r`` <= ``max_rank``, A [r, in] and B [out, r] fitting the served weights they adapt."""
    if not max_rank:
        raise PushRefused(400, "a LoRA adapter was sent to a server started without --lora_rank: start it with "
                               "the trainer's lora_rank")
    try:
        config = json.loads((folder / ADAPTER_CONFIG).read_text())
    except OSError as e:
        raise PushRefused(422, f"the adapter folder {folder} has no readable {ADAPTER_CONFIG}: "
                               f"{e.strerror or e}") from e
    except ValueError as e:
        raise PushRefused(422, f"{folder / ADAPTER_CONFIG} is not JSON ({e})") from e
    rank = config.get("r") if isinstance(config, dict) else None
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise PushRefused(422, f"{folder / ADAPTER_CONFIG} gives no rank r (got {rank!r})")
    if rank > max_rank:
        raise PushRefused(422, f"the adapter's rank {rank} is over this server's lora_rank {max_rank}: start it "
                               "with the trainer's lora_rank")
    file = folder / ADAPTER_FILE
    if not file.is_file():
        raise PushRefused(422, f"the adapter folder {folder} holds no {ADAPTER_FILE}")
    found = 0
    for name, shape in read_header(file).items():
        side = name[-8] if name.endswith((".lora_A.weight", ".lora_B.weight")) else None
        if side is None:
            continue
        base = name.removeprefix("base_model.model.")[:-len(".lora_A.weight")] + ".weight"
        if base not in served or len(served[base]) != 2:
            raise PushRefused(422, f"{file}: {name} adapts {base}, which is not a matrix of the served model")
        out, inp = served[base]
        want = (rank, inp) if side == "A" else (out, rank)
        if shape != want:
            raise PushRefused(422, f"{file}: {name} is {list(shape)}; rank {rank} on {base} {[out, inp]} needs "
                                   f"{list(want)}")
        found += 1
    if not found:
        raise PushRefused(422, f"{file} holds no LoRA matrices (…lora_A.weight, …lora_B.weight)")
