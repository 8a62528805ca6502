"""Prompt datasets: rows read and checked before any generation. A row is ``"prompt"`` (text or chat messages)
plus the source's other columns unchanged, which reach the reward functions as keywords."""

from __future__ import annotations

import csv
import json
import random
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from grouprl.data.hub import config_problem, is_saved_dataset, load_hub
from grouprl.errors import DataError, PromptTooLongError
from grouprl.registry import Registry
from grouprl.types import to_messages

Row = dict[str, Any]
PREVIEW_CHARS = 120
READERS: Registry[Callable[[Path], list[Row]]] = Registry("prompt file format")  # file suffix -> reader


@READERS.register(".jsonl")
def _read_jsonl(path: Path) -> list[Row]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}: line {line_no} is not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}: line {line_no} is a {type(row).__name__}, expected a JSON object")
            rows.append(row)
    return rows


@READERS.register(".json")
def _read_json(path: Path) -> list[Row]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not (isinstance(data, list) and all(isinstance(r, dict) for r in data)):
        raise DataError(f"{path}: expected a JSON list of objects (one per row)")
    return data


@READERS.register(".csv")
def _read_csv(path: Path) -> list[Row]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


@READERS.register(".parquet")
def _read_parquet(path: Path) -> list[Row]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def _from_datasets(data: Any, split: str | None, where: str) -> list[Row]:
    """Rows of a ``datasets.Dataset``, or of one split of a ``DatasetDict``."""
    if isinstance(data, dict):  # a DatasetDict
        splits = list(data.keys())
        chosen = split or ("train" if "train" in splits else None)
        if chosen not in splits:
            raise DataError(f"{where} has splits {splits}; choose one with split=...")
        data = data[chosen]
    return data.to_list()


TEXT_FORMATS = (".jsonl", ".json", ".csv")


def _check_utf8(path: Path) -> None:
    raw = path.read_bytes()
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise DataError(f"{path}, line {line}: byte {raw[e.start]:#04x} is not UTF-8; save the file as UTF-8") from None


def load_records(source: str | Path | Any, split: str | None = None, config: str | None = None) -> list[Row]:
    """Rows from a JSONL / JSON / CSV / parquet file, a ``save_to_disk`` or hub-layout folder, a hub id, a
    ``datasets`` object or a list of dicts; ``split`` picks a split where there are several (empty = train)."""
    if isinstance(source, list):
        return [dict(r) for r in source]
    if not isinstance(source, str | Path):
        return _from_datasets(source, split, type(source).__name__)
    problem = config_problem(str(source), config)
    if problem:
        raise DataError(problem)
    path = Path(source).expanduser()
    if path.is_dir() and is_saved_dataset(path):
        import datasets

        try:
            return _from_datasets(datasets.load_from_disk(str(path)), split, str(path))
        except FileNotFoundError as e:
            raise DataError(f"{path} looks like a folder written by save_to_disk but cannot be read ({e})") from None
    if path.is_file():
        reader = READERS.get(path.suffix.lower())
        if path.suffix.lower() in TEXT_FORMATS:
            _check_utf8(path)
        return reader(path)
    missing = missing_file(source)
    if missing:
        raise DataError(missing)
    return _from_datasets(load_hub(str(path) if path.is_dir() else str(source), config, split), split, str(source))


FILE_SUFFIX = re.compile(r"\.[A-Za-z]\w*")  # a hub id's version number (AI-MO/NuminaMath-1.5) is not one


def missing_file(source: str | Path) -> str | None:
    """What is wrong with ``source`` when it names a file (a path, or a name with a file's suffix) that does not
    exist; None when it exists or reads as a hub id.

    >>> missing_file("prompts.jsonl"), missing_file("openai/gsm8k"), missing_file("AI-MO/NuminaMath-1.5")
    ("prompt file 'prompts.jsonl' does not exist", None, None)
    """
    path = Path(source).expanduser()
    if path.exists() or not (str(source).startswith(("/", ".", "~")) or FILE_SUFFIX.fullmatch(path.suffix)):
        return None
    return f"prompt file {str(source)!r} does not exist"


def row_places(source: str | Path | Any, count: int, split: str | None = None) -> list[str]:
    """Where each of the ``count`` rows read from ``source`` sits, for messages: ``"prompts.jsonl line 7"``,
    ``"data.json item 2"``, else ``"<source> row 2"``."""
    path = Path(source).expanduser() if isinstance(source, str | Path) else None
    if path is None or not path.is_file():
        where = source if isinstance(source, str | Path) else type(source).__name__
        return [f"{where}{' ' + split if split else ''} row {i}" for i in range(count)]
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        with open(path, encoding="utf-8") as f:
            places = [f"{path.name} line {n}" for n, line in enumerate(f, 1) if line.strip()]
    elif suffix == ".csv":
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.reader(f)
            next(reader, None)  # the header
            places, start = [], reader.line_num + 1
            for _ in reader:
                places.append(f"{path.name} line {start}")
                start = reader.line_num + 1
    elif suffix == ".json":
        places = [f"{path.name} item {i}" for i in range(count)]
    else:
        places = [f"{path.name} row {i}" for i in range(count)]
    return places if len(places) == count else [f"{path.name} row {i}" for i in range(count)]


def _as_messages(value: Any) -> list[dict[str, str]] | None:
    """``value`` as chat messages if it is a list of dicts (or one as JSON text, as CSV stores it), else None."""
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    if isinstance(value, list | tuple) and value and all(isinstance(m, dict) for m in value):
        return [dict(m) for m in value]
    return None


def normalise_prompt(value: Any, row: int) -> str | list[dict[str, str]]:
    """A valid prompt (non-empty text, or messages each with string role and content)."""
    messages = _as_messages(value)
    if messages is not None:
        for m in messages:
            if not (isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise DataError(f"row {row}: every chat message needs string 'role' and 'content', got {m!r}")
        return messages
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"row {row}: the prompt must be non-empty text or a list of chat messages, got {value!r}")
    return value


ANSWER = "answer"  # the gold answer's column, as reward functions and the accuracy checker get it


def load_prompts(source: str | Path | Any, prompt_column: str = "prompt", system_prompt: str | None = None,
                 split: str | None = None, config: str | None = None, answer_column: str = ANSWER) -> list[Row]:
    """Prompt rows from ``source``: ``prompt_column`` renamed ``"prompt"`` (validated), ``answer_column``
    ``"answer"``, other columns kept; ``system_prompt`` goes first in each prompt without one."""
    rows = load_records(source, split, config)
    where = source if isinstance(source, str | Path) else type(source).__name__
    if not rows:
        raise DataError(f"dataset {where} has no rows")
    renames = {prompt_column: "prompt", answer_column: ANSWER}
    for i, row in enumerate(rows):
        columns = ", ".join(map(repr, row))
        for column, key in renames.items():
            if column == key:
                continue
            if column not in row:
                field = "prompt_column" if key == "prompt" else "answer_column"
                raise DataError(f"dataset {where}: row {i} ({row_places(source, len(rows))[i]}) has no column "
                                f"{column!r} ({field}); columns: {columns}")
            if key in row:
                what = "the prompt column" if key == "prompt" else "the answer column"
                raise DataError(f"dataset {where} has both {column!r} ({what}) and {key!r}; rename one of them")
            row[key] = row.pop(column)
        if "prompt" not in row:
            raise DataError(f"dataset {where}: row {i} ({row_places(source, len(rows))[i]}) has no column "
                            f"'prompt'; columns: {columns}")
        try:
            prompt = normalise_prompt(row.pop("prompt"), i)
        except DataError as e:
            raise DataError(f"dataset {where}, {row_places(source, len(rows))[i]}: {e}") from None
        row["prompt"] = to_messages(prompt, system_prompt) if system_prompt else prompt
    return rows


def train_eval_split(rows: Sequence[Row], eval_fraction: float | None = None, eval_size: int | None = None,
                     seed: int = 0) -> tuple[list[Row], list[Row]]:
    """Split rows at random into train and eval, each in the original order, by ``eval_fraction`` (at least 1 row)
    or ``eval_size``.

    >>> train, held = train_eval_split([{"prompt": str(i)} for i in range(10)], eval_size=3, seed=0)
    >>> len(train), len(held)
    (7, 3)
    """
    if (eval_fraction is None) == (eval_size is None):
        raise ValueError("give exactly one of eval_fraction or eval_size")
    if eval_fraction is not None:
        if not 0.0 < eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
        eval_size = max(1, round(eval_fraction * len(rows)))
    if not 0 < eval_size < len(rows):
        raise ValueError(f"eval_size {eval_size} leaves no train or no eval rows out of {len(rows)}")
    held = set(random.Random(seed).sample(range(len(rows)), eval_size))
    return ([r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held])


def check_prompt_lengths(token_lists: Sequence[Sequence[int]], max_len: int, rows: Sequence[Row] | None = None) -> None:
    """Fail if any prompt has more than ``max_len`` tokens, naming the first such row, its length and its prompt."""
    too_long = [i for i, ids in enumerate(token_lists) if len(ids) > max_len]
    if not too_long:
        return
    i = too_long[0]
    preview = ""
    if rows is not None:
        text = str(rows[i].get("prompt", ""))
        preview = f" (prompt {text[:PREVIEW_CHARS] + ('...' if len(text) > PREVIEW_CHARS else '')!r})"
    raise PromptTooLongError(
        f"{len(too_long)} prompt(s) longer than {max_len} tokens; first: row {i} with {len(token_lists[i])} "
        f"tokens{preview}. Shorten or drop them, or lower the completion length."
    )


def context_overflow(row: str, prompt_len: int, context: int, budget_key: str, budget: int,
                     longest: int | None = None, shorten: str = "shorten the prompt or drop the row") -> str:
    """The message for a prompt that leaves less than ``budget`` of the model's ``context``, naming the room the
    batch's ``longest`` prompt leaves when that one fits, else this one's."""
    fix = shorten[:1].upper() + shorten[1:]
    if prompt_len >= context:
        return (f"{row}: the prompt alone is {prompt_len} tokens after the chat template and the model's context is "
                f"{context} tokens, so no {budget_key} leaves room for a completion. {fix}, or use a model with a "
                "longer context.")
    if longest is not None and prompt_len <= longest < context:
        bound, whose = context - longest, "the room the longest prompt here leaves"
    else:
        bound, whose = context - prompt_len, "the room this prompt leaves"
    return (f"{row}: the prompt is {prompt_len} tokens after the chat template; with {budget_key}={budget} that is "
            f"over the model's context of {context} tokens. {fix}, or lower {budget_key} to at most {bound} ({whose}).")


def check_rows(rows: Sequence[Row], what: str, needs_prompt: bool = True) -> None:
    """Fail unless ``rows`` (``what``: train or eval) is a non-empty list of rows, with prompts if ``needs_prompt``."""
    if not rows:
        raise DataError(f"the {what} set is empty")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"{what} row {i} is a {type(row).__name__}, not a mapping of columns")
        if needs_prompt and "prompt" not in row:
            raise DataError(f"{what} row {i} has no 'prompt' column; its columns are: {', '.join(row)}")
