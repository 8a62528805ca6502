"""Early-warning signs: the rules by hand, replayed on a committed run, printed and reported by a run."""

import json
from pathlib import Path

import pytest

from grouprl.run.health import HealthWatch, replay

RUN_30 = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "smollm2-30-steps" / "metrics.jsonl"


def test_each_rule_by_hand():
    watch = HealthWatch()
    # entropy: start = mean of steps 1-2 = 2.0; step 3 at 0.6 = 0.30x (fine), step 4 at 0.4 = 0.20x (fires)
    ratios = []
    for step, entropy in enumerate([2.2, 1.8, 0.6, 0.4], 1):
        signs, _ = watch.observe(step, {"policy/entropy": entropy})
        ratios.append(signs.get("health/entropy_ratio"))
    assert ratios == [None, None, pytest.approx(0.3), pytest.approx(0.2)] and watch.fired == {"entropy": 4}
    # KL: judged after 5 steps; median of (0.1, 0.1, 0.2, 0.2, 0.3) = 0.2, so 0.7 = 3.5x fires, 0.5 = 2.5x not
    watch = HealthWatch()
    for step, kl in enumerate([0.1, 0.1, 0.2, 0.2, 0.3], 1):
        assert watch.observe(step, {"policy/kl": kl})[1] == []
    signs, active = watch.observe(6, {"policy/kl": 0.7})
    assert signs["health/kl_spike"] == pytest.approx(3.5) and active[0].startswith("KL 0.70 is 3.5x")
    assert watch.new == active  # newly fired: printed
    assert watch.observe(7, {"policy/kl": 0.5})[1] == [] and watch.new == []
    # all-equal groups: three steps in a row at >= 0.75
    watch = HealthWatch()
    runs = [watch.observe(s, {"rollout/zero_std_frac": z})[0]["health/zero_std_run"]
            for s, z in enumerate([1.0, 0.75, 0.5, 0.8, 0.9, 1.0], 1)]
    assert runs == [1, 2, 0, 1, 2, 3] and "zero_std" in watch.fired and watch.fired["zero_std"] == 6


def test_a_masking_correction_that_drops_most_of_the_batch_is_named_with_the_mismatch():
    watch = HealthWatch()
    # 0.49 of the tokens dropped: under the 0.5 line; 0.93 (what sequence-mask's default band dropped of
    # SmolLM2-135M's bf16 rollouts against fp32 training, mismatch KL 9.4e-4): fires, naming both numbers
    assert watch.observe(1, {"rollout/is_masked_frac": 0.49, "rollout/mismatch_kl": 4e-4})[1] == []
    _, active = watch.observe(2, {"rollout/is_masked_frac": 0.93, "rollout/mismatch_kl": 9.4e-4})
    assert active == watch.new and len(active) == 1 and watch.fired == {"masked": 2}
    assert active[0].startswith("the rollout correction dropped 93% of the policy tokens")
    assert "(rollout/mismatch_kl 9.4e-04)" in active[0] and "sequence_mask_low/high" in active[0]
    # still active the next step, so not printed again; a truncating correction logs no masked share
    assert watch.observe(3, {"rollout/is_masked_frac": 1.0})[1] and watch.new == []
    assert watch.observe(4, {"rollout/is_capped_frac": 1.0})[1] == []


def test_replayed_on_the_committed_30_step_run():
    records = [json.loads(line) for line in RUN_30.read_text().splitlines()]
    found = replay(records)
    steps = {kind: [s for s, w in found if w.startswith(kind)] for kind in ("entropy", "KL")}
    # entropy fell from 2.0 to 0.26 by step 7; KL jumped at steps 8, 12 and 22 (0.49, 0.88, 1.52)
    assert steps["entropy"][0] == 7 and steps["KL"] == [8, 12, 22]


def test_a_run_prints_its_warnings_and_the_report_lists_them(tmp_path, capsys):
    from grouprl.cli import main
    from grouprl.report import write_report
    from tests.cli.test_cli import tiny_run_args

    # a reward every completion earns alike: every group all-equal, nothing to learn from, from step 1
    module = tmp_path / "flat.py"
    module.write_text("def flat(prompts, completions, **_):\n    return [1.0] * len(completions)\n")
    args = tiny_run_args(tmp_path, "--total_steps", "4")
    args[args.index("--reward_functions") + 1] = f"{module}:flat"
    code = main(["train", *args])
    out = capsys.readouterr().out
    assert code == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in records if "rollout/zero_std_frac" in r]
    assert len(trained) == 4 and all("health/warnings" in r for r in trained)
    fired = replay(records)
    assert [s for s, _ in fired] == [3] and fired[0][1].startswith("3 steps in a row with 75%+ of groups all-equal")
    assert f"step 3: {fired[0][1]}" in out  # printed the step it fired (no progress bar: plain print)
    html = write_report(tmp_path / "run").read_text()
    assert "Early warnings" in html and fired[0][1].split(":")[0] in html
