"""Report generation from a synthetic run folder: plots, HTML, summary, robustness."""

from __future__ import annotations

import json
import math
import random
import re
import struct
from html.parser import HTMLParser
from pathlib import Path

import pytest

from grouprl.report import summarize, write_report
from grouprl.report.data import ema, read_jsonl, series

HOSTILE = '<script>alert("x")</script> & <b>'
STEPS = 30


def training_line(step: int, rng: random.Random) -> dict:
    """Metrics of one step, shaped like a run that learns: reward up, zero-std groups down."""
    progress = step / STEPS
    correct = min(1.0, max(0.0, 0.2 + 0.5 * progress + rng.gauss(0, 0.08)))
    fmt = min(1.0, 0.6 + 0.4 * progress)
    rollout, reward, logprobs, update = 4 + rng.random(), 0.1, 1.5, 3 + rng.random()
    return {
        "step": step, "wall_time": step * 10.0,
        "reward/mean": correct + 0.5 * fmt, "reward/std": 0.4, "reward/correct": correct, "reward/format": fmt,
        "rollout/zero_std_frac": 0.6 - 0.3 * progress, "rollout/len_mean": 40 - 10 * progress, "rollout/len_max": 64,
        "rollout/truncated_frac": 0.2 * (1 - progress), "policy/kl": 0.002 * step,
        "policy/entropy": 1.2 - 0.4 * progress,
        "policy/clip_low": 0.01 * rng.random(), "policy/clip_high": 0.02 * rng.random(),
        "loss/total": rng.gauss(0, 0.01), "loss/policy": rng.gauss(0, 0.01), "loss/kl": 0.04 * 0.002 * step,
        "optim/grad_norm": 1 + rng.random(), "optim/lr": 1e-6,
        "time/rollout": rollout, "time/reward": reward, "time/logprobs": logprobs, "time/update": update,
        "time/step": rollout + reward + logprobs + update + 0.3, "throughput/tokens_per_s": 80.0,
        "memory/peak_rss_mb": 3000.0 + step, "custom/unknown_key": 1.0,
    }


def make_run(run_dir: Path, keep=lambda key: True, summary: dict | None = None) -> Path:
    """A run folder with STEPS training steps, evals at 0/15/30, completions at 4 steps and a
    metrics file whose last line was cut off mid-write. ``keep`` filters metric keys."""
    rng = random.Random(0)
    lines = []
    for step in range(STEPS + 1):
        if step % 15 == 0:
            acc = 0.2 + 0.4 * step / STEPS
            lines.append({"step": step, "wall_time": step * 10.0, "eval/accuracy": acc, "eval/mean_reward": acc + 0.5,
                          "eval/pass@4": min(1.0, acc + 0.2), "eval/len_mean": 30.0})
        if step >= 1:
            lines.append(training_line(step, rng))
    lines = [{k: v for k, v in line.items() if k in ("step", "wall_time") or keep(k)} for line in lines]
    run_dir.mkdir(parents=True)
    text = "".join(json.dumps(line) + "\n" for line in lines)
    (run_dir / "metrics.jsonl").write_text(text + '{"step": 31, "reward/me')  # killed mid-write
    rows = []
    for step in (1, 10, 20, 30):
        for i in range(8):
            prompt = f"What is {step}+{i // 4}? {HOSTILE}"
            rows.append({"step": step, "prompt": prompt, "completion": f"{step + i // 4} {HOSTILE}", "reward": i % 2,
                         "rewards": {"correct": i % 2, "format": None}, "advantage": (i % 2) - 0.5})
    (run_dir / "completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "config.yaml").write_text(f"lr: 1.0e-06\nsystem_prompt: '{HOSTILE}'\n")
    if summary is not None:
        (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


class Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.targets, self.details, self.text = [], 0, []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.targets += [attrs[a] for a in ("src", "href") if a in attrs]
        self.details += tag == "details"
        assert tag not in ("script", "b"), f"run data became markup: <{tag}>"

    def handle_data(self, data):
        self.text.append(data)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path.name} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_full_report_files_images_links_and_escaping(tmp_path):
    run = make_run(tmp_path / "run")
    html_path = write_report(run)
    assert html_path == run / "report" / "report.html"
    pngs = sorted(p.name for p in (run / "report").glob("*.png"))
    assert pngs == sorted(["reward.png", "accuracy.png", "zero_std.png", "kl.png", "entropy.png", "length.png",
                           "clip.png", "time.png", "loss.png", "optim.png"])
    for name in pngs:
        width, height = png_size(run / "report" / name)
        assert width >= 600 and height >= 300 and (run / "report" / name).stat().st_size > 10_000
    html = html_path.read_text()
    parser = Links()
    parser.feed(html)
    assert parser.targets, "the report links nothing"
    for target in parser.targets:
        assert not re.match(r"[a-z]+:", target), f"external asset {target}"
        assert (html_path.parent / target).is_file(), f"broken link {target}"
    assert {t for t in parser.targets if t.endswith(".png")} == set(pngs)
    assert "../metrics.jsonl" in parser.targets and "../summary.json" not in parser.targets  # no summary.json here
    assert HOSTILE not in html and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &lt;b&gt;" in html
    assert parser.details == 3  # first, middle and last logged steps, each collapsible
    text = " ".join("".join(parser.text).split())
    assert "Step 1: 8 completions" in text and "Step 20: 8" in text and "Step 30: 8" in text and "Step 10" not in text
    assert "system_prompt:" in text  # the resolved config is shown


def test_missing_metrics_skip_their_plots_and_stale_images_go(tmp_path):
    run = make_run(tmp_path / "run", keep=lambda k: k in ("reward/mean", "time/rollout", "time/update"))
    (run / "report").mkdir()
    (run / "report" / "kl.png").write_bytes(b"from an earlier report, when KL was logged")
    html = write_report(run, max_samples_per_step=3).read_text()
    assert sorted(p.name for p in (run / "report").glob("*.png")) == ["reward.png", "time.png"]
    assert "Step 30: 3 of 8 completions, mean reward 0.5" in html  # the mean covers all 8, not the 3 shown
    assert "accuracy.png" not in html and "kl.png" not in html and "No evaluation was logged" in html


def test_empty_run_folder_still_gets_a_report(tmp_path):
    (tmp_path / "run").mkdir()
    html = write_report(tmp_path / "run").read_text()
    assert "nothing to plot" in html and "No completions were logged" in html
    assert not list((tmp_path / "run" / "report").glob("*.png"))
    with pytest.raises(FileNotFoundError, match="Run folder .*nope does not exist"):
        write_report(tmp_path / "nope")


def test_reader_skips_cut_off_last_line_and_keeps_latest_of_repeated_steps(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n{"step": 2, "a": 5, "b": NaN}\n{"step": 3, "a"')
    records = read_jsonl(path)
    assert len(records) == 3
    assert series(records, "a") == ([1, 2], [1.0, 5.0])  # resumed run: the later step 2 wins
    assert series(records, "b") == ([], [])  # NaN is not plotted
    path.write_text('{"step": 1}\n{broken\n{"step": 2}\n')
    with pytest.warns(UserWarning, match=r"m.jsonl:2: skipped"):
        assert len(read_jsonl(path)) == 2


def test_summary_numbers(tmp_path):
    run = make_run(tmp_path / "run")
    s = summarize(run)
    assert s["last_step"] == STEPS and s["wall_time_s"] == 300.0
    assert s["eval_before"]["accuracy"] == pytest.approx(0.2) and s["eval_after"]["accuracy"] == pytest.approx(0.6)
    assert s["eval_source"] == "metrics.jsonl"
    assert s["best"]["eval/accuracy"] == {"step": 30, "value": pytest.approx(0.6)}
    assert s["final"]["custom/unknown_key"] == 1.0  # unknown keys are kept, not dropped
    assert s["final"]["memory/peak_rss_mb"] == 3030.0
    run2 = make_run(tmp_path / "run2", summary={"eval_before": {"eval/accuracy": 0.1}, "eval_after": {"accuracy": 0.9},
                                               "model": "tiny"})
    s2 = summarize(run2)
    assert s2["eval_before"] == {"accuracy": 0.1} and s2["eval_after"] == {"accuracy": 0.9}
    assert s2["eval_source"] == "summary.json" and s2["run_summary"] == {"model": "tiny"}


def test_ema_starts_at_first_value_and_tracks_a_constant():
    assert ema([]) == []
    assert ema([2.0, 2.0, 2.0]) == [2.0, 2.0, 2.0]
    out = ema([0.0, 1.0, 1.0], span=3)  # alpha = 0.5
    assert out == [0.0, 0.5, 0.75] and not any(math.isnan(v) for v in out)


def test_a_single_reward_function_is_named_in_its_panel():
    """With one reward function the per-function curve repeats the total, so its title says which
    function it is (a legend of one series is not drawn); with several, the legend names them."""
    from grouprl.report.plots import _panel_plots

    def reward_panel(keys):
        return next(panels for name, _, panels in _panel_plots(keys) if name == "reward.png")[1]

    one = reward_panel(["reward/mean", "reward/std", "reward/exact_match"])
    assert one.title == "Reward function exact_match" and one.keys == ("reward/exact_match",)
    two = reward_panel(["reward/mean", "reward/format", "reward/exact_match"])
    assert two.title == "Per reward function" and set(two.keys) == {"reward/format", "reward/exact_match"}
