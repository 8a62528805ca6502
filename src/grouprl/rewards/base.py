"""The reward-function protocol, calling a list of them on a batch, and combining their scores.

A reward function is any callable ``fn(prompts, completions, *, completion_ids, **columns)`` returning one
``float`` per row, or ``None`` where it does not apply. It gets only the dataset columns its signature names (all
with ``**kwargs``); ``async`` functions are awaited together. A failure is a :class:`RewardFunctionError` naming
the function, the row and the completion.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import math
import numbers
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from grouprl.errors import RewardFunctionError


class RewardFn(Protocol):
    def __call__(self, prompts: list[Any], completions: list[str], **kwargs: Any) -> list[float | None]: ...


def reward_name(fn: Callable[..., Any]) -> str:
    """The name a reward function's metrics are logged under: ``name``, ``__name__``, a partial's, or its class's.

    >>> def exact(prompts, completions): ...
    >>> reward_name(exact), reward_name(functools.partial(exact))
    ('exact', 'exact')
    """
    name = getattr(fn, "name", None)
    if isinstance(name, str) and name:
        return name
    if hasattr(fn, "__name__"):
        return fn.__name__
    if isinstance(fn, functools.partial):
        return reward_name(fn.func)
    return type(fn).__name__


def unique_names(fns: Sequence[Callable[..., Any]]) -> list[str]:
    """``reward_name`` of each function, with ``_2``, ``_3`` ... appended to repeats."""
    seen: dict[str, int] = {}
    names = []
    for fn in fns:
        base = reward_name(fn)
        seen[base] = seen.get(base, 0) + 1
        names.append(base if seen[base] == 1 else f"{base}_{seen[base]}")
    return names


@dataclass
class _Params:
    """How a reward function is called, and what its signature accepts beyond prompts and completions."""

    by_name: bool  # it names ``completions``: prompts and completions go by keyword
    takes_prompts: bool
    var_keyword: bool
    accepted: frozenset[str]
    required: frozenset[str]


BY_NAME = ("prompts", "completions")


def _params(fn: Callable[..., Any]) -> _Params:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # some C callables have no signature: give them everything
        return _Params(by_name=False, takes_prompts=True, var_keyword=True, accepted=frozenset(),
                       required=frozenset())
    params = list(sig.parameters.values())
    var_keyword = any(p.kind == p.VAR_KEYWORD for p in params)
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if "completions" in named:  # def f(completions, **kwargs), def f(prompts, completions, answer)
        rest = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in BY_NAME]
        return _Params(by_name=True, takes_prompts=var_keyword or "prompts" in named, var_keyword=var_keyword,
                       accepted=frozenset(p.name for p in rest),
                       required=frozenset(p.name for p in rest if p.default is p.empty))
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    rest = [p for p in params if p.kind == p.KEYWORD_ONLY] + positional[2:]
    return _Params(by_name=False, takes_prompts=True, var_keyword=var_keyword, accepted=frozenset(p.name for p in rest),
                   required=frozenset(p.name for p in rest if p.default is p.empty))


def _call(fn: Callable[..., Any], prompts: list[Any], completions: list[str], kwargs: dict[str, list[Any]]) -> Any:
    """``fn`` on one batch: ``fn(prompts, completions, **kwargs)``, or by name where it names ``completions``."""
    params = _params(fn)
    if not params.by_name:
        return fn(prompts, completions, **kwargs)
    data: dict[str, Any] = {"prompts": prompts} if params.takes_prompts else {}
    return fn(completions=completions, **data, **kwargs)


def check_reward_columns(reward_fns: Sequence[Callable[..., Any]], column_names: Sequence[str]) -> None:
    """Fail before any generation if a reward function needs a column the data lacks, or cannot take its inputs."""
    available = set(column_names) | {"completion_ids"}
    for fn in reward_fns:
        params = _params(fn)
        missing = sorted(params.required - available)
        if missing:
            raise RewardFunctionError(
                reward_name(fn),
                f"needs column(s) {', '.join(map(repr, missing))}, which the data lacks "
                f"(columns: {', '.join(sorted(column_names)) or 'none'})",
            )
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):
            continue
        kwargs = _kwargs_for(fn, dict.fromkeys(available))
        try:
            if params.by_name:
                signature.bind(completions=None, **({"prompts": None} if params.takes_prompts else {}), **kwargs)
            else:
                signature.bind(None, None, **kwargs)
        except TypeError as e:
            raise RewardFunctionError(
                reward_name(fn), f"cannot be called as fn(prompts, completions, **columns) or with completions= "
                                 f"by name: {e}") from e


def _kwargs_for(fn: Callable[..., Any], available: dict[str, list[Any]]) -> dict[str, list[Any]]:
    params = _params(fn)
    if params.var_keyword:
        return dict(available)
    return {k: v for k, v in available.items() if k in params.accepted}


def _await_all(awaitables: list[Awaitable[Any]]) -> list[Any]:
    """Await concurrently; exceptions are returned in place of results so each is attributed."""

    async def caught(awaitable: Awaitable[Any]) -> Any:
        try:
            return await awaitable
        except (Exception, SystemExit) as e:  # noqa: BLE001 - gather re-raises SystemExit even with return_exceptions
            return e

    async def gather() -> list[Any]:
        return await asyncio.gather(*(caught(a) for a in awaitables))

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(gather())
    # Called from inside a running loop (a notebook, an async trainer): a fresh loop in a thread.
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, gather()).result()


def _call_one_row(fn: Callable[..., Any], prompts: list[Any], completions: list[str],
                  kwargs: dict[str, list[Any]], i: int) -> Any:
    result = _call(fn, prompts[i:i + 1], completions[i:i + 1], {k: v[i:i + 1] for k, v in kwargs.items()})
    return _await_all([result])[0] if inspect.isawaitable(result) else result


def _locate_failure(fn: Callable[..., Any], prompts: list[Any], completions: list[str],
                    kwargs: dict[str, list[Any]], error: BaseException) -> RewardFunctionError:
    """Re-run ``fn`` row by row to find the first row it fails on, for the error message."""
    name = reward_name(fn)
    for i in range(len(completions)):
        try:
            result = _call_one_row(fn, copy.deepcopy(prompts), list(completions), kwargs, i)
        except (Exception, SystemExit) as row_error:  # noqa: BLE001 - any failure is the one being reported
            return RewardFunctionError(name, f"raised {type(row_error).__name__}: {row_error}", i, completions[i])
        if isinstance(result, BaseException):
            return RewardFunctionError(name, f"raised {type(result).__name__}: {result}", i, completions[i])
    return RewardFunctionError(name, f"raised {type(error).__name__} on the batch (no single row fails alone): "
                                     f"{error}")


def _to_tensor(name: str, values: Any, completions: list[str]) -> torch.Tensor:
    """Validate a returned list -> [B] float32 with NaN for None."""
    if isinstance(values, torch.Tensor) or type(values).__module__ == "numpy":
        values = values.tolist()
    if not isinstance(values, list | tuple):  # a dict, a string or a set would be iterated as something else
        raise RewardFunctionError(name, f"returned {type(values).__name__}, expected a list of B floats")
    values = list(values)
    if len(values) != len(completions):
        raise RewardFunctionError(name, f"returned {len(values)} values for {len(completions)} completions")
    out = []
    for i, v in enumerate(values):
        if v is None:
            out.append(math.nan)
            continue
        if not isinstance(v, numbers.Real):
            raise RewardFunctionError(name, f"returned {v!r} ({type(v).__name__}); use a float, or None to skip",
                                      i, completions[i])
        if not math.isfinite(float(v)):
            raise RewardFunctionError(name, f"returned {float(v)} (use None to skip a row)", i, completions[i])
        out.append(float(v))
    return torch.tensor(out, dtype=torch.float32)


def combine(per_fn: dict[str, torch.Tensor], weights: dict[str, float]) -> torch.Tensor:
    """Weighted sum over the functions that applied to each row: [B] float32, NaN where none did.

    >>> combine({"a": torch.tensor([1.0, float("nan"), float("nan")]), "b": torch.tensor([2.0, 3.0, float("nan")])},
    ...         {"a": 1.0, "b": 0.5})
    tensor([2.0000, 1.5000,    nan])
    """
    if not per_fn:
        raise ValueError("combine needs at least one reward function")
    values = torch.stack(list(per_fn.values()))  # [F, B]
    w = torch.tensor([weights[k] for k in per_fn], dtype=torch.float32).unsqueeze(1)  # [F, 1]
    applied = ~torch.isnan(values)
    total = torch.where(applied, values * w, torch.zeros_like(values)).sum(0)  # [B]
    return torch.where(applied.any(0), total, torch.full_like(total, math.nan))


@dataclass
class RewardScores:
    """Rewards for B rows: ``total [B]`` (weighted sum over the functions that applied, NaN where none did) and
    ``per_fn`` name -> ``[B]`` (NaN where that function returned None), float32."""

    total: torch.Tensor
    per_fn: dict[str, torch.Tensor]
    weights: dict[str, float]


def _check_inputs(reward_fns: Sequence[Any], weights: Sequence[float] | None, prompts: list[Any],
                  completions: list[str], completion_ids: list[list[int]] | None,
                  columns: dict[str, list[Any]]) -> list[float]:
    if not reward_fns:
        raise ValueError("no reward functions given")
    weights = [1.0] * len(reward_fns) if weights is None else [float(w) for w in weights]
    if len(weights) != len(reward_fns):
        raise ValueError(f"{len(weights)} reward weights for {len(reward_fns)} reward functions")
    sizes = {"prompts": len(prompts), "completions": len(completions), **{k: len(v) for k, v in columns.items()}}
    if completion_ids is not None:
        sizes["completion_ids"] = len(completion_ids)
    wrong = {k: n for k, n in sizes.items() if n != len(completions)}
    if wrong:
        raise ValueError(f"every list must have one entry per completion ({len(completions)}); got {wrong}")
    return weights


def score_rewards(reward_fns: Sequence[Callable[..., Any]], weights: Sequence[float] | None, prompts: list[Any],
                  completions: list[str], completion_ids: list[list[int]] | None = None,
                  columns: dict[str, list[Any]] | None = None) -> RewardScores:
    """Call F reward functions (``weights``: F floats, None for 1.0) on B rows and combine them; ``completion_ids``
    (B unpadded id lists) and ``columns`` (each B values) go as keywords."""
    columns = dict(columns or {})
    weights = _check_inputs(reward_fns, weights, prompts, completions, completion_ids, columns)
    names = unique_names(reward_fns)
    available = dict(columns)
    if completion_ids is not None:
        available["completion_ids"] = completion_ids
    check_reward_columns(reward_fns, list(available))

    # Each function gets its own copies: one that edits its inputs must not change what the next
    # function, the logs or the trainer see.
    kwargs = [copy.deepcopy(_kwargs_for(fn, available)) for fn in reward_fns]
    inputs = [(copy.deepcopy(prompts), list(completions)) for _ in reward_fns]
    results: list[Any] = [None] * len(reward_fns)
    pending: dict[int, Awaitable[Any]] = {}
    for j, fn in enumerate(reward_fns):
        try:
            results[j] = _call(fn, *inputs[j], kwargs[j])
        except RewardFunctionError:
            raise  # it names what failed itself (a remote reward's service): no re-run row by row
        except (Exception, SystemExit) as e:  # noqa: BLE001 - reported with the function and row at fault
            raise _locate_failure(fn, prompts, completions, copy.deepcopy(kwargs[j]), e) from e
        if inspect.isawaitable(results[j]):
            pending[j] = results[j]
    for j, result in zip(pending, _await_all(list(pending.values()))):
        results[j] = result
        if isinstance(result, RewardFunctionError):
            raise result
        if isinstance(result, Exception | SystemExit):
            raise _locate_failure(reward_fns[j], prompts, completions, kwargs[j], result) from result

    per_fn = {name: _to_tensor(name, res, completions) for name, res in zip(names, results)}
    weight_map = dict(zip(names, weights))
    return RewardScores(total=combine(per_fn, weight_map), per_fn=per_fn, weights=weight_map)
