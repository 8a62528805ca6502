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
    write(ablation, "grouprl", 12, {0: 0.1, 4: 0.3, 8: 0.5, 12: 0.45})
    write(tmp_path / "ablations" / "y", "grouprl", 8, {0: 0.2, 4: 0.3, 8: 0.4})  # scored by another evaluation
    args = argparse.Namespace(compare_with=str(base), ablations=str(tmp_path / "ablations"))
    own = report.read_records(ablation / "results.jsonl")
    theirs = report.compared(args, own, own[0]["settings"])
    assert [r["step"] for r in theirs] == [0, 4, 8, 12]  # TRL's records only, cut at this run's last step
    assert report.by_run(theirs)  # and a finished run of 12 steps, not dropped as unfinished
    report.ablations(args)
    rows = {line.split(" | ")[0]: line for line in (tmp_path / "ablations" / "ablations.md").read_text().splitlines()
            if line.startswith("| ")}
    assert rows["| run"].startswith("| run | step 0 | step 4 |") and "step 24 | fall" in rows["| run"]
    # the baseline at its own 24 steps: best 0.9 at the last -> fall 0.000; 0.9 against TRL's 0.9 -> 1.00
    assert rows["| baseline (the demo's settings)"].endswith("| 0.900 | 0.000 | 1.00 |")
    # the 12-step row: blank past step 12; best 0.5 at step 8, 0.45 last -> fall 0.050; against TRL's 0.6 at
    # step 12 (not its 0.9 at step 24) -> 0.75
    assert rows["| x"].endswith("| 0.450 | - | - | - | 0.050 | 0.75 |")
    assert rows["| TRL (baseline)"].endswith("| 0.900 | 0.000 | 1.00 |")
    assert rows["| y (*)"].startswith("| y (*) | 0.200 | 0.300 | 0.400 | - |")
    assert "(*) Its step 0 is not the baseline's" in (tmp_path / "ablations" / "ablations.md").read_text()


def test_a_baseline_shorter_than_the_run_is_refused(report, tmp_path):
    write(tmp_path / "base", "trl", 8, {0: 0.1, 4: 0.4, 8: 0.5})
    write(tmp_path / "run", "grouprl", 12, {0: 0.1, 4: 0.3, 8: 0.5, 12: 0.6})
    own = report.read_records(tmp_path / "run" / "results.jsonl")
    with pytest.raises(SystemExit, match="steps 8"):
        report.compared(argparse.Namespace(compare_with=str(tmp_path / "base")), own, own[0]["settings"])
