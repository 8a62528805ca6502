"""What a benchmark's ``--smoke`` flag changes: the smallest shapes and the tiny random model (``tiny``), so the
whole script runs in seconds and prints its last line. Its figure means nothing then; the point is that a renamed
field or function breaks ``tests/test_benchmarks_smoke.py``, not a command the docs publish."""

from __future__ import annotations

import argparse
from typing import Any


def add_smoke(parser: argparse.ArgumentParser, what: str) -> None:
    """The ``--smoke`` flag, its help saying ``what`` the script then runs."""
    parser.add_argument("--smoke", action="store_true", help=f"check that the benchmark still runs: {what}")


def shrink(args: argparse.Namespace, **values: Any) -> argparse.Namespace:
    """With ``--smoke``, ``args`` with each of ``values`` set (the smallest shapes); else ``args`` as given. A
    callable value is called first, only with ``--smoke`` (a temporary output folder is made only then)."""
    if args.smoke:
        for key, value in values.items():
            setattr(args, key, value() if callable(value) else value)
    return args


def policy(name: str, smoke: bool, *, for_vllm: bool = False, **options: Any) -> tuple[Any, Any]:
    """(model, tokenizer): ``name`` through ``grouprl.models.load_policy`` with ``options``, or with ``smoke`` the
    tiny random 2-layer model (fp32, seed 0); ``for_vllm``: with heads of 64 dimensions, the smallest vLLM's CPU
    attention takes."""
    from grouprl.models import load_policy, tiny_causal_lm

    if not smoke:
        return load_policy(name, **options)
    return tiny_causal_lm(seed=0, hidden_size=128, num_heads=2, num_kv_heads=2) if for_vllm else tiny_causal_lm(seed=0)


def tiny_folder(folder: str, for_vllm: bool = False) -> str:
    """The tiny model (:func:`policy`) saved as a model folder at ``folder``, for a ``--model`` option."""
    from pathlib import Path

    from grouprl.run.checkpoint_files import save_policy

    model, tokenizer = policy("", True, for_vllm=for_vllm)
    save_policy(model, Path(folder), tokenizer)
    return folder
