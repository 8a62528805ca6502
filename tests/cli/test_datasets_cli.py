"""``grouprl train`` on a hub dataset as users name it: a folder in GSM8K's hub layout with its config,
a training split and a held-out split, the prompt in ``question`` and the gold in ``answer`` ('#### N')."""

from __future__ import annotations

import json

import yaml

from grouprl.cli import main
from tests.helpers.hub_layout import write_gsm8k_layout

GSM8K_KEYS = ["--dataset_config", "main", "--dataset_split", "train", "--eval_split", "test", "--prompt_column",
              "question", "--system_prompt", "Answer with '#### <number>' on the last line.",
              "--reward_functions", "accuracy"]


def test_training_on_a_gsm8k_layout_folder_measures_held_out_accuracy(tmp_path, capsys):
    folder = write_gsm8k_layout(tmp_path / "gsm8k", train=12, test=4)
    run = tmp_path / "run"
    code = main(["train", "--model", "tiny", "--dataset", str(folder), *GSM8K_KEYS, "--total_steps", "2",
                 "--prompts_per_step", "2", "--group_size", "2", "--max_new_tokens", "4", "--eval_samples", "1",
                 "--eval_every", "1", "--no-progress", "--output_dir", str(run)])
    assert code == 0, capsys.readouterr().err
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evaluated = [m for m in metrics if "eval/accuracy" in m]
    assert len(evaluated) >= 3  # before training, after each of the 2 steps (eval_every 1) and/or at the end
    assert all(isinstance(m["eval/accuracy"], float) and 0.0 <= m["eval/accuracy"] <= 1.0 for m in evaluated)
    config = yaml.safe_load((run / "config.yaml").read_text())  # the resolved config names the split and config
    assert (config["dataset_config"], config["dataset_split"], config["eval_split"]) == ("main", "train", "test")
    # grouprl eval of the run: the 4 rows of the test split, scored by the same checker
    summary = json.loads((run / "summary.json").read_text())
    capsys.readouterr()
    assert main(["eval", "--config", str(run / "config.yaml"), "--model", str(run)]) == 0
    table = dict(line.split(maxsplit=1) for line in capsys.readouterr().out.splitlines() if line.strip())
    assert table["prompts"] == f"4 held-out from {folder} (test)"
    assert float(table["accuracy"]) == summary["eval_after"]["eval/accuracy"]
