"""What a run with rollout servers leaves in its folder is the run's own (a resume after a kill is not refused),
and the servers' token is never written down with the run's config."""

from __future__ import annotations

import json

import pytest

from grouprl.config import TrainConfig
from grouprl.errors import ConfigError
from grouprl.run.files import as_plain
from grouprl.run.folder import claim_output_dir, foreign_entries


def killed_run_with_servers(folder):
    """What a run at max_staleness 1 with rollout_servers: 1 leaves when SIGKILLed after step 2's checkpoint."""
    (folder / "checkpoints" / "step-2").mkdir(parents=True)
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 2, "reward/mean": 0.5}) + "\n")
    (folder / "timeline.jsonl").write_text(json.dumps({"step": 3, "event": "rollout"}) + "\n")
    (folder / ".timeline.jsonl.1234.tmp").write_text("")  # a rewrite the kill interrupted
    (folder / "servers").mkdir()
    (folder / "servers" / "server-0.log").write_text("grouprl serve: tiny in fp32\n")


def test_a_killed_run_with_servers_is_resumable_and_its_files_are_its_own(tmp_path):
    killed_run_with_servers(tmp_path)
    assert foreign_entries(tmp_path) == []
    lock, resumable = claim_output_dir(tmp_path, resume_from="latest", echo=lambda text: None)
    lock.release()
    assert resumable and (tmp_path / "servers" / "server-0.log").exists()


def test_overwrite_removes_the_servers_logs_and_the_timeline_as_run_files(tmp_path):
    killed_run_with_servers(tmp_path)
    said = []
    lock, _ = claim_output_dir(tmp_path, overwrite=True, echo=said.append)
    lock.release()
    assert said == [f"replacing the earlier run in {tmp_path}"]
    assert not (tmp_path / "servers").exists() and not (tmp_path / "timeline.jsonl").exists()


def test_a_users_file_among_the_servers_logs_is_still_refused(tmp_path):
    killed_run_with_servers(tmp_path)
    (tmp_path / "servers" / "notes.txt").write_text("mine")
    assert foreign_entries(tmp_path) == ["servers/notes.txt"]
    with pytest.raises(ConfigError, match=r"holds files that are not a run's \(servers/notes.txt\)"):
        claim_output_dir(tmp_path, resume_from="latest", echo=lambda text: None)


def test_the_servers_token_is_kept_out_of_the_saved_config_and_the_configs_repr():
    token = "the-servers-token-0123456789"
    config = TrainConfig(rollout_server_token=token, rollout_servers=("10.0.0.2:8000",))
    plain = as_plain(config)
    assert "rollout_server_token" not in plain and plain["rollout_servers"] == ["10.0.0.2:8000"]
    assert token not in repr(config) and token not in json.dumps(plain)
