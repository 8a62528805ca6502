"""Datasets through the ``datasets`` library: a hub id (``openai/gsm8k``) or a folder in the hub's layout, with a
config and a split, or a ``save_to_disk`` folder; a failure is one :class:`DataError` naming all three."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grouprl.errors import DataError

SAVED_MARKERS = ("dataset_dict.json", "state.json")  # what save_to_disk writes at the top of its folder
OFFLINE_ERRORS = ("ConnectionError", "ConnectError", "OfflineModeIsEnabled", "LocalEntryNotFoundError", "Timeout",
                  "ConnectTimeout", "ReadTimeout")
"""Exception class names (in an error's class hierarchy or cause chain) that mean the hub was not reached."""


def is_saved_dataset(folder: Path) -> bool:
    return any((folder / name).is_file() for name in SAVED_MARKERS)


def config_problem(source: str | None, config: str | None) -> str | None:
    """What is wrong with giving ``dataset_config`` for ``source`` (a file or ``save_to_disk`` folder has none)."""
    if not (source and config):
        return None
    path = Path(source).expanduser()
    if path.is_file():
        return f"dataset_config={config!r} names a config of a hub dataset, but dataset {source!r} is a file"
    if path.is_dir() and is_saved_dataset(path):
        return (f"dataset_config={config!r} names a config of a hub dataset, but dataset {source!r} is a folder "
                "written by save_to_disk, which holds one config already: leave dataset_config empty")
    return None


def split_problem(source: str | None, key: str, split: str | None) -> str | None:
    """What is wrong with choosing split ``split`` (config key ``key``) of ``source``: a file holds one."""
    if source and split and Path(source).expanduser().is_file():
        return (f"{key}={split!r} picks a split of a dataset folder or hub id, but {source!r} is a file, which "
                "holds one: leave it empty, or give the held-out rows as a file of their own (eval_dataset)")
    return None


def _unreachable(error: BaseException) -> bool:
    seen: BaseException | None = error
    while seen is not None:
        if any(cls.__name__ in OFFLINE_ERRORS for cls in type(seen).__mro__):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def how_to_fetch(name: str, config: str | None) -> str:
    """The two ways to bring hub dataset ``name`` onto a machine that cannot reach the hub."""
    folder = "data/" + name.rsplit("/", 1)[-1]
    args = f"{name!r}" + (f", {config!r}" if config else "")
    return (f"on a machine that reaches the hub, either `hf download {name} --repo-type dataset --local-dir {folder}` "
            f"(huggingface_hub's command line) and copy the folder here, then set dataset: {folder} (the hub's layout: "
            f"dataset_config and the splits work as they do with the id), or `python -c \"import datasets; "
            f"datasets.load_dataset({args}).save_to_disk('{folder}')\"` and set dataset: {folder} with "
            "dataset_config empty. A dataset already in the local cache loads with HF_HUB_OFFLINE=1")


def load_hub(source: str, config: str | None, split: str | None) -> Any:
    """``datasets.load_dataset(source, config, split=split)`` (a DatasetDict when ``split`` is None); every failure
    is a :class:`DataError`."""
    import datasets

    what = f"dataset {source!r}" + (f" (dataset_config {config!r})" if config else "")
    try:
        return datasets.load_dataset(source, config, split=split)
    except Exception as e:  # noqa: BLE001 - whatever datasets raises becomes one message naming the dataset
        folder = Path(source).expanduser().is_dir()
        if folder and isinstance(e, datasets.exceptions.DataFilesNotFoundError | FileNotFoundError):
            raise DataError(f"{what} is a folder but neither a saved `datasets` dataset (save_to_disk) nor one in "
                            "the hub's layout (a README.md listing configs and data files, or data files datasets "
                            f"recognises): {e}") from e
        if not folder and _unreachable(e):
            raise DataError(f"{what} is not in the local cache and the Hugging Face hub cannot be reached from "
                            f"here ({type(e).__name__}). To use it: {how_to_fetch(source, config)}.") from e
        if not folder and isinstance(e, datasets.exceptions.DatasetNotFoundError):
            raise DataError(f"{what} is neither a file, a folder nor a dataset on the Hugging Face hub ({e}); a "
                            "gated or private dataset needs `hf auth login` first") from e
        split_note = f", split {split!r}" if split else ""
        raise DataError(f"{what}{split_note} could not be loaded: {e}") from e
