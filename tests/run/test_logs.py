"""Peak memory is the measuring process's own, not inherited from the process that started it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
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


class _Spy:
    """Stands for ``open`` inside grouprl.run.logs: records each opening's mode and the characters written."""

    def __init__(self):
        self.calls: list[tuple[str, int]] = []

    def __call__(self, path, mode="r", *args, **kwargs):
        f = open(path, mode, *args, **kwargs)  # noqa: SIM115 - handed back to the caller, who closes it
        if "a" not in mode and "w" not in mode:
            return f
        spy, write = self, f.write

        def counted(text):
            spy.calls[-1] = (spy.calls[-1][0], spy.calls[-1][1] + len(text))
            return write(text)

        f.write = counted
        self.calls.append((mode, 0))
        return f


def test_an_append_writes_only_its_own_lines_whatever_the_file_holds(tmp_path, monkeypatch):
    """The old log rewrote the whole file on each append: N appends wrote O(N^2) bytes, and a step
    after a 2 MB observation rewrote megabytes. Now each append opens the file in append mode and
    writes exactly its line."""
    from grouprl.run.logs import JsonlLog

    path = tmp_path / "completions.jsonl"
    path.write_text(json.dumps({"step": 0, "completion": "x" * 2_000_000}) + "\n")  # 2 MB already there
    spy = _Spy()
    monkeypatch.setattr("grouprl.run.logs.open", spy, raising=False)
    log = JsonlLog(path)
    lines = [json.dumps({"step": i, "reward/mean": i / 8}) + "\n" for i in range(1, 201)]
    for i in range(1, 201):
        log.append({"step": i, "reward/mean": i / 8})
    assert [mode for mode, _ in spy.calls] == ["a"] * 200
    assert [n for _, n in spy.calls] == [len(line) for line in lines]  # e.g. '{"step": 1, "reward/mean": 0.125}\n'
    assert sum(n for _, n in spy.calls) == path.stat().st_size - 2_000_000 - len('{"step": 0, "completion": ""}\n')
    assert [r["step"] for r in log.records()] == list(range(201))


def test_the_metrics_lines_keep_todays_format(tmp_path):
    from grouprl.run.logs import JsonlLog

    log = JsonlLog(tmp_path / "metrics.jsonl")
    log.append({"step": 3, "wall_time": 1.5, "reward/mean": torch.tensor(0.25), "policy/kl": float("nan"),
                "loss/total": float("inf"), "note": "é"})
    assert (tmp_path / "metrics.jsonl").read_text(encoding="utf-8") == (
        '{"step": 3, "wall_time": 1.5, "reward/mean": 0.25, "policy/kl": null, "loss/total": Infinity, "note": "é"}\n')


def test_a_torn_last_line_is_skipped_on_read_and_cut_off_on_resume(tmp_path):
    from grouprl.report.data import read_jsonl
    from grouprl.run.logs import JsonlLog

    path = tmp_path / "metrics.jsonl"
    log = JsonlLog(path)
    log.append([{"step": 1, "reward/mean": 0.5}, {"step": 2, "reward/mean": 0.75}])
    whole = path.read_bytes()
    with open(path, "ab") as f:
        f.write('{"step": 3, "note": "caf\u00e9'.encode()[:-1])  # a kill mid-write, inside a 2-byte character
    assert [r["step"] for r in log.records()] == [1, 2]
    assert [r["step"] for r in read_jsonl(path)] == [1, 2]
    resumed = JsonlLog(path)  # what a resumed run opens
    assert path.read_bytes() == whole, "the torn line is cut off, the whole ones kept byte for byte"
    resumed.append({"step": 3, "reward/mean": 1.0})
    assert [json.loads(line)["step"] for line in path.read_text().split("\n") if line] == [1, 2, 3]


def test_a_whole_record_that_lost_only_its_newline_is_kept(tmp_path):
    from grouprl.run.logs import JsonlLog

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}')
    JsonlLog(path).append({"step": 3})
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n{"step": 3}\n'


def test_a_file_of_nothing_but_a_torn_line_is_emptied(tmp_path):
    from grouprl.run.logs import JsonlLog

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "rew')
    log = JsonlLog(path)
    assert path.read_text() == "" and log.records() == []


def test_a_2_mb_observation_is_cut_to_the_cap_with_a_marker(tmp_path):
    """An agent's record with a 2 MB observation: the other strings are short, so the observation gets
    what they leave of the cap, its first and last halves kept around the marker."""
    from grouprl.run.logs import RECORD_TEXT_CAP, JsonlLog

    observation = "<" + "x" * 1_999_998 + ">"
    record = {"step": 1, "prompt": "p", "completion": "guess 5", "reward": 1.0,
              "trajectory": [{"role": "user", "content": observation}, {"role": "assistant", "content": "guess 5"}]}
    log = JsonlLog(tmp_path / "completions.jsonl", text_cap=RECORD_TEXT_CAP)
    log.append(record)
    (got,) = log.records()
    # the short strings: "p" 1, "guess 5" 7, "user" 4, "assistant" 9, "guess 5" 7 = 28 characters, kept whole;
    # the observation gets 16000 - 28 = 15972: its first 7986 and last 7986 characters around the marker
    kept = RECORD_TEXT_CAP - 28
    assert got["trajectory"][1] == {"role": "assistant", "content": "guess 5"}
    assert (got["prompt"], got["completion"], got["trajectory"][0]["role"]) == ("p", "guess 5", "user")
    text = got["trajectory"][0]["content"]
    assert text == observation[:7986] + f"[... {2_000_000 - kept} characters cut ...]" + observation[-7986:]
    assert text.startswith("<x") and text.endswith("x>")
    size = (tmp_path / "completions.jsonl").stat().st_size
    assert size < RECORD_TEXT_CAP + 300, f"{size} bytes logged for a record capped at {RECORD_TEXT_CAP} characters"


def test_the_cap_is_shared_by_a_level_and_spares_short_strings():
    from grouprl.run.logs import KEPT_WHOLE, cap_text

    record = {"a": "a" * 100, "b": "b" * 500, "c": "c" * 1000, "roles": ["user"] * 3}
    out = cap_text(record, cap=712)
    # 3 x "user" = 12 and "a" 100 fit under the level; 712 - 12 - 100 = 600 left for b and c: 300 each
    assert out["a"] == "a" * 100 and out["roles"] == ["user"] * 3
    assert out["b"] == "b" * 150 + "[... 200 characters cut ...]" + "b" * 150
    assert out["c"] == "c" * 150 + "[... 700 characters cut ...]" + "c" * 150
    assert cap_text(record, cap=1612) is record  # 1612 characters in all: nothing to cut
    tiny = cap_text({"x": "x" * 100, "y": "y" * 100}, cap=10)  # the level (5) is under the floor
    assert tiny["x"] == "x" * (KEPT_WHOLE // 2) + "[... 36 characters cut ...]" + "x" * (KEPT_WHOLE // 2)


@pytest.mark.slow
def test_a_run_killed_mid_line_resumes_with_whole_logs(tmp_path):
    from tests.helpers.trainer import make_trainer

    make_trainer(tmp_path, total_steps=1, save_every=1).train()
    run = tmp_path / "run"
    for name in ("metrics.jsonl", "completions.jsonl"):
        with open(run / name, "a", encoding="utf-8") as f:
            f.write('{"step": 2, "reward/me')  # killed while writing step 2
    make_trainer(tmp_path, total_steps=2, resume_from="latest").train()
    for name in ("metrics.jsonl", "completions.jsonl"):
        text = (run / name).read_text(encoding="utf-8")
        # every line whole JSON: the torn fragment, left in place, would have been glued to step 2's first line
        records = [json.loads(line) for line in text.split("\n") if line]
        assert sorted({r["step"] for r in records if r["step"]}) == [1, 2], name
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().split("\n") if line]
    assert [r["step"] for r in metrics if "reward/mean" in r] == [1, 2]
