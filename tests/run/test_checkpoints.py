"""Checkpoints under kills and damage: the last good one stays readable, `latest` picks only whole
ones, a damaged file is named with the checkpoint before it, and a resumed run's logs repeat nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from grouprl.cli import main
from grouprl.errors import CheckpointError
from grouprl.run import checkpoint_files as ckpt
from grouprl.run.logs import JsonlLog
from tests.helpers.trainer import make_trainer


def trained(tmp_path, **overrides):
    trainer = make_trainer(tmp_path, total_steps=2, save_every=1, keep_checkpoints=3, **overrides)
    trainer.train()
    return trainer, Path(trainer.config.output_dir) / "checkpoints"


def test_every_checkpoint_has_a_manifest_of_its_files(tmp_path):
    _, root = trained(tmp_path)
    folder = ckpt.checkpoint_dirs(root)[-1]
    manifest = json.loads((folder / ckpt.MANIFEST).read_text())
    files = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()} - {ckpt.MANIFEST}
    assert set(manifest) == files and "model/model.safetensors" in files and "state.json" in files
    assert all(len(e["sha256"]) == 64 for e in manifest.values())


def test_saving_a_step_again_keeps_the_checkpoint_that_is_there(tmp_path):
    trainer, root = trained(tmp_path)
    final = root / "step-000002"
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in final.rglob("*")}
    trainer.save()  # the final save after a periodic one of the same step: nothing is deleted or rewritten
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in final.rglob("*")} == before
    assert not list(root.glob(".tmp-*")) and not list(root.glob(".delete-*"))


def test_latest_skips_an_incomplete_checkpoint_with_a_warning(tmp_path):
    _, root = trained(tmp_path)
    newest = root / "step-000002"
    with open(newest / "model" / "model.safetensors", "r+b") as f:  # torn by a kill mid-copy
        f.truncate(100)
    with pytest.warns(UserWarning, match="skipping .*step-000002.*incomplete"):
        assert ckpt.resolve_checkpoint("latest", root) == root / "step-000001"
    (root / "step-000001" / ckpt.MANIFEST).write_text("{")  # torn manifest
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"), pytest.warns(UserWarning):
        ckpt.resolve_checkpoint("latest", root)


def test_a_checkpoint_from_before_manifests_still_resumes_with_a_warning(tmp_path):
    trainer, root = trained(tmp_path)
    (root / "step-000002" / ckpt.MANIFEST).unlink()
    assert ckpt.resolve_checkpoint("latest", root) == root / "step-000002"
    with pytest.warns(UserWarning, match="before checkpoints carried a manifest"):
        trainer.resume("latest")
    assert trainer.step_count == 2


def test_a_damaged_file_is_named_with_the_checkpoint_before_it(tmp_path, capsys):
    trainer, root = trained(tmp_path)
    weights = root / "step-000002" / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF  # one flipped byte: same size, different content
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError,
                       match=r"model\.safetensors is damaged.*step-000001, is intact: pass it to --resume_from"):
        trainer.resume(str(root / "step-000002"))
    trainer.resume(str(root / "step-000001"))
    assert trainer.step_count == 1


def test_resuming_a_damaged_checkpoint_from_the_command_line_exits_2(tmp_path, capsys):
    args = ["--model", "tiny", "--task", "arithmetic", "--reward_functions", "grouprl.cli.demo:digit_share",
            "--prompts_per_step", "2", "--group_size", "2", "--max_new_tokens", "4", "--total_steps", "2",
            "--save_every", "1", "--eval_size", "0", "--no-progress", "--output_dir",
            str(tmp_path / "run")]
    assert main(["train", *args]) == 0
    (tmp_path / "run" / "checkpoints" / "step-000002" / "rng.pt").write_bytes(b"junk")
    capsys.readouterr()
    code = main(["train", *args, "--total_steps", "3", "--resume_from",
                 str(tmp_path / "run" / "checkpoints" / "step-000002")])
    err = capsys.readouterr().err
    assert code == 2 and "rng.pt" in err and "step-000001" in err


def test_pruning_never_leaves_a_half_deleted_step_folder(tmp_path, monkeypatch):
    trainer, root = trained(tmp_path)
    removed = []

    def killed_midway(path, ignore_errors=False):
        removed.append(Path(path).name)
        raise KeyboardInterrupt  # the kill lands inside the removal

    monkeypatch.setattr("grouprl.run.checkpoint_files.shutil.rmtree", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        ckpt.retire(root / "step-000001")
    assert removed[0].startswith(".delete-step-000001")
    assert [p.name for p in ckpt.checkpoint_dirs(root)] == ["step-000002"]  # the old one is out of the names
    monkeypatch.undo()
    trainer.step_count = 3
    trainer.save()  # the next save clears the leftover
    assert not list(root.glob(".delete-*"))


def test_a_run_resumed_after_its_final_evaluation_does_not_log_it_again(tmp_path):
    trainer = make_trainer(tmp_path, total_steps=2, save_every=2, eval_every=0)
    trainer.train()
    log = Path(trainer.config.output_dir) / "metrics.jsonl"
    evals = [json.loads(line)["step"] for line in log.read_text().splitlines() if "eval/accuracy" in line]
    again = make_trainer(tmp_path, total_steps=2, save_every=2, eval_every=0, resume_from="latest")
    summary = again.train()
    assert [json.loads(line)["step"] for line in log.read_text().splitlines() if "eval/accuracy" in line] == evals
    assert summary["eval_after"]["eval/accuracy"] == trainer.eval_history[-1]["eval/accuracy"]


def test_stale_temporary_log_files_of_a_killed_writer_are_removed(tmp_path):
    (tmp_path / ".metrics.jsonl.abc123.tmp").write_text("half")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    log = JsonlLog(tmp_path / "metrics.jsonl")
    assert log.records() == [{"step": 1}] and os.listdir(tmp_path) == ["metrics.jsonl"]


def test_a_sharded_checkpoint_is_refused_in_one_process_with_how_to_resume_it(tmp_path):
    """A process group's checkpoint (``world_size`` in its state) holds no optimizer.pt: one process
    names how it was written instead of failing on a missing file."""
    folder = tmp_path / "step-00000002"
    folder.mkdir()
    (folder / "state.json").write_text(json.dumps({"step": 2, "world_size": 1}))
    trainer = make_trainer(tmp_path / "run")
    with pytest.raises(ValueError, match=r"process group \(one process on a GPU\).*--model"):
        ckpt.load_checkpoint(folder, policy=trainer.policy)
