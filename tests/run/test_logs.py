"""Peak memory is the measuring process's own, not inherited from the process that started it."""

from __future__ import annotations

import subprocess
import sys

import torch

from grouprl.run.logs import peak_rss_mb


def test_a_spawned_process_reports_its_own_peak_not_its_parents():
    block = torch.ones(100 * 2**20)  # 400 MiB touched in this process
    parent = peak_rss_mb()
    code = "from grouprl.run.logs import peak_rss_mb; print(peak_rss_mb())"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    del block
    assert parent > 400
    assert float(child.stdout) < parent - 300  # a bare interpreter: tens of MiB, whatever its parent held


def test_a_completion_holding_unicode_line_breaks_survives_a_reopened_log(tmp_path):
    """Sampled text may hold U+2028, U+0085 or U+001E, which str.splitlines splits at and json.dumps
    (ensure_ascii=False) writes as they are: reopening the log on resume must keep those lines whole."""
    from grouprl.report.data import read_jsonl
    from grouprl.run.folder import holds_run
    from grouprl.run.logs import JsonlLog

    odd = "a\u2028b\x85c\x1ed\u2029e"
    log = JsonlLog(tmp_path / "completions.jsonl")
    log.append([{"step": 1, "completion": odd}, {"step": 2, "completion": "x"}])
    reopened = JsonlLog(tmp_path / "completions.jsonl")
    assert reopened.records() == [{"step": 1, "completion": odd}, {"step": 2, "completion": "x"}]
    reopened.truncate_after(1)
    assert read_jsonl(tmp_path / "completions.jsonl") == [{"step": 1, "completion": odd}]
    JsonlLog(tmp_path / "metrics.jsonl").append({"step": 1, "note": odd})
    assert holds_run(tmp_path)


def test_the_progress_bar_shows_an_agents_success_and_turns_only_when_the_run_has_them():
    from grouprl.run.logs import Progress

    bar = Progress(total=3, start=0, enabled=True)
    try:
        bar.update(1, {"reward/mean": 0.5, "policy/kl": 0.01, "throughput/tokens_per_s": 120.0})
        fields = bar.bar.tasks[0].fields
        assert (fields["reward"], fields["kl"], fields["tps"], fields["extra"]) == ("0.500", "0.0100", "120", "")
        bar.update(2, {"reward/mean": 0.25, "env/success": 0.375, "env/turns_mean": 2.25}, alert="entropy falling")
        fields = bar.bar.tasks[0].fields
        assert fields["extra"] == "  success 0.38  turns 2.2  [yellow]! entropy falling[/yellow]"
        assert fields["kl"] == "-" and bar.bar.tasks[0].completed == 2
    finally:
        bar.close()
