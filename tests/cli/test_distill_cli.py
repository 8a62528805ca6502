"""``grouprl train`` distilling a teacher into the policy from prompts alone: no reward function, no answers."""

from __future__ import annotations

import json

import yaml

from grouprl.cli import main


def test_distilling_from_a_prompts_file_with_no_reward_function(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Tell me about {i}."}) + "\n" for i in range(8)))
    run = tmp_path / "run"
    code = main(["train", "--model", "tiny", "--teacher_model", "tiny", "--distill_coef", "1",
                 "--dataset", str(prompts), "--total_steps", "2", "--prompts_per_step", "2", "--group_size", "2",
                 "--max_new_tokens", "4",
                 "--eval_every", "0", "--no-progress", "--output_dir", str(run)])
    assert code == 0, capsys.readouterr().err
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "distill/reverse_kl" in m]
    assert len(steps) == 2
    # the tiny teacher is another random model (seed + 1) than the policy: they disagree on the sampled tokens
    assert all(m["distill/reverse_kl"] != 0.0 and m["distill/teacher_logp"] < 0 for m in steps)
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert (config["teacher_model"], config["distill_coef"]) == ("tiny", 1.0)


def test_a_teacher_without_a_coefficient_is_refused_before_any_model_loads(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Hi"}) + "\n")
    code = main(["train", "--model", "tiny", "--teacher_model", "tiny", "--dataset", str(prompts),
                 "--output_dir", str(tmp_path / "run")])
    assert code != 0
    assert "is read only with distill_coef > 0" in capsys.readouterr().err
