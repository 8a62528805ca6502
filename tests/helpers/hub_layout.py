"""A dataset folder in the Hugging Face hub's layout, shaped like openai/gsm8k's ``main`` config: a README.md
whose front matter lists the config's data files per split, and parquet files with ``question`` and
``answer`` columns, each answer a worked solution ending ``#### N``."""

from __future__ import annotations

from pathlib import Path

README = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train-*.parquet
  - split: test
    path: main/test-*.parquet
- config_name: socratic
  data_files:
  - split: train
    path: socratic/train-*.parquet
---
# Word problems in GSM8K's layout (made up for tests)
"""


def problem(i: int) -> dict[str, str]:
    """Problem ``i``: ``a`` apples plus ``b`` more, its gold ``#### a+b``."""
    a, b = 3 + i, 10 + 2 * i
    return {"question": f"Tom has {a} apples and buys {b} more. How many apples does he have now?",
            "answer": f"He has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}"}


def gold(i: int) -> int:
    """The number problem ``i``'s gold answer ends with."""
    return (3 + i) + (10 + 2 * i)


def write_gsm8k_layout(folder: Path, train: int = 12, test: int = 4) -> Path:
    """``folder`` with config main (``train`` rows: problems 0.., ``test`` rows: the problems after them)
    and config socratic (2 train rows), as ``hf download --repo-type dataset --local-dir`` leaves a hub dataset."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for sub in ("main", "socratic"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text(README)
    pq.write_table(pa.Table.from_pylist([problem(i) for i in range(train)]),
                   folder / "main" / "train-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist([problem(i) for i in range(train, train + test)]),
                   folder / "main" / "test-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist([problem(100), problem(101)]),
                   folder / "socratic" / "train-00000-of-00001.parquet")
    return folder


MATH_README = """---
configs:
- config_name: algebra
  data_files:
  - split: train
    path: algebra/train-*.parquet
  - split: test
    path: algebra/test-*.parquet
---
# Problems in the layout of a MATH dataset on the hub (made up for tests)
"""


def write_math_layout(folder: Path, train: int = 6, test: int = 2) -> Path:
    """``folder`` with config algebra: ``problem``, ``level``, ``type`` and ``solution`` columns, each solution
    ending in ``\\boxed{n}``, as EleutherAI/hendrycks_math lays out a subject."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def row(i: int) -> dict[str, str]:
        return {"problem": f"Solve for $x$: $x - {i} = {i}$.", "level": "Level 1", "type": "Algebra",
                "solution": f"Adding {i} to both sides gives $x = \\boxed{{{2 * i}}}$."}

    (folder / "algebra").mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text(MATH_README)
    pq.write_table(pa.Table.from_pylist([row(i) for i in range(1, train + 1)]),
                   folder / "algebra" / "train-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist([row(i) for i in range(train + 1, train + test + 1)]),
                   folder / "algebra" / "test-00000-of-00001.parquet")
    return folder
