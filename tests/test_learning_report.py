"""``benchmarks/learning_report.py``: a shorter ablation read against a longer baseline's curves."""

import argparse
import importlib
import json
import pathlib
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
SETTINGS = {"save_every": 4, "eval_problems": 32, "eval_samples": 8, "threads": 1}


@pytest.fixture(scope="module")
def report():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("learning_report")
    finally:
        sys.path.remove(str(BENCHMARKS))


def write(folder: pathlib.Path, framework: str, steps: int, accuracy: dict[int, float]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "results.jsonl").open("a") as f:
        for step, acc in accuracy.items():
            f.write(json.dumps({"framework": framework, "seed": 0, "step": step, "accuracy": acc,
                                "train_seconds": 10.0 * step, "command": f"{framework} {steps}",
                                "settings": {**SETTINGS, "steps": steps}}) + "\n")


def test_a_12_step_run_reads_the_first_12_steps_of_a_24_step_baseline(report, tmp_path):
    base, ablation = tmp_path / "base", tmp_path / "ablations" / "x"
    write(base, "trl", 24, {0: 0.1, 4: 0.4, 8: 0.5, 12: 0.6, 16: 0.7, 20: 0.8, 24: 0.9})
    write(base, "grouprl", 24, {0: 0.1, 4: 0.5, 8: 0.6, 12: 0.3, 16: 0.7, 20: 0.7, 24: 0.9})
    write(ablation, "grouprl", 12, {0: 0.1, 4: 0.3, 8: 0.5, 12: 0.6})
    args = argparse.Namespace(compare_with=str(base), ablations=str(tmp_path / "ablations"))
    own = report.read_records(ablation / "results.jsonl")
    theirs = report.compared(args, own, own[0]["settings"])
    assert [r["step"] for r in theirs] == [0, 4, 8, 12]  # TRL's records only, cut at this run's last step
    assert report.by_run(theirs)  # and a finished run of 12 steps, not dropped as unfinished
    report.ablations(args)
    rows = {line.split(" | ")[0]: line for line in (tmp_path / "ablations" / "ablations.md").read_text().splitlines()
            if line.startswith("| ")}
    assert "step 16" not in rows["| run"]
    # baseline cut at 12: best 0.6 at step 8, last 0.3 -> fall 0.300; step_ratio 0.3 / TRL's 0.6 = 0.50
    assert rows["| baseline (the demo's settings)"].endswith("| 0.300 | 0.50 |")
    assert rows["| x"].endswith("| 0.000 | 1.00 |")  # 0.6 at step 12 against TRL's 0.6


def test_a_baseline_shorter_than_the_run_is_refused(report, tmp_path):
    write(tmp_path / "base", "trl", 8, {0: 0.1, 4: 0.4, 8: 0.5})
    write(tmp_path / "run", "grouprl", 12, {0: 0.1, 4: 0.3, 8: 0.5, 12: 0.6})
    own = report.read_records(tmp_path / "run" / "results.jsonl")
    with pytest.raises(SystemExit, match="steps 8"):
        report.compared(argparse.Namespace(compare_with=str(tmp_path / "base")), own, own[0]["settings"])
