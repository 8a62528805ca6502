"""GRPO runs that stop and start: resuming in a fresh process is bit-identical, a kill while saving keeps the
previous checkpoint, and a run whose numbers stop being finite stops without saving them."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from grouprl.run.checkpoint_files import checkpoint_dirs
from tests.helpers.trainer import RESUME_SETTINGS, make_trainer

RESUME_SCRIPT = textwrap.dedent(
    """
    import sys, torch
    torch.set_num_threads(1)
    sys.path.insert(0, {root!r})
    from tests.helpers.trainer import make_trainer, RESUME_SETTINGS
    from pathlib import Path
    trainer = make_trainer(Path({tmp!r}), total_steps=4, resume_from="latest", **RESUME_SETTINGS)
    trainer.train()
    torch.save({{k: v.detach() for k, v in trainer.policy.named_parameters()}}, {out!r})
    """
)


def test_resume_in_a_fresh_process_is_bit_identical(tmp_path):
    """4 steps straight == 2 steps, then a new process resuming from the checkpoint for 2 more.
    Off-policy settings (mu=2, two minibatches) so optimizer moments and the old-policy path matter."""
    straight = make_trainer(tmp_path / "a", total_steps=4, **RESUME_SETTINGS)
    straight.train()
    make_trainer(tmp_path / "b", total_steps=2, **RESUME_SETTINGS).train()
    root = str(Path(__file__).resolve().parents[2])
    code = RESUME_SCRIPT.format(root=root, tmp=str(tmp_path / "b"), out=str(tmp_path / "b4.pt"))
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root, timeout=300)
    resumed = torch.load(tmp_path / "b4.pt")
    for k, v in straight.policy.named_parameters():
        assert torch.equal(v.detach(), resumed[k]), k
    steps = [json.loads(x)["step"] for x in (tmp_path / "b" / "run" / "metrics.jsonl").read_text().splitlines()
             if "reward/mean" in x]
    assert steps == [1, 2, 3, 4]


def test_a_kill_during_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    trainer = make_trainer(tmp_path, total_steps=1)
    trainer.train()
    root = Path(trainer.config.output_dir) / "checkpoints"
    good = checkpoint_dirs(root)[-1]
    good_files = sorted(p.name for p in good.rglob("*"))

    def dies(*args, **kwargs):
        raise KeyboardInterrupt("killed while writing the optimizer state")

    monkeypatch.setattr("grouprl.run.checkpoint_files.torch.save", dies)
    trainer.step_count = 1  # pretend a later step, then save with a process that dies mid-write
    with pytest.raises(KeyboardInterrupt):
        trainer.save()
    assert checkpoint_dirs(root) == [good]
    assert sorted(p.name for p in good.rglob("*")) == good_files
    monkeypatch.undo()
    trainer.step_count = 2
    trainer.save()
    assert [p.name for p in checkpoint_dirs(root)] == ["step-000001", "step-000002"]
    assert not list(root.glob(".tmp-*"))


def test_a_non_finite_gradient_stops_the_run_naming_the_step_and_keeps_the_checkpoints(tmp_path):
    from grouprl.errors import NonFiniteError
    from grouprl.run.checkpoint_files import is_complete

    trainer = make_trainer(tmp_path, lr=1e30, max_grad_norm=0, total_steps=4, save_every=1, beta=0.0)
    with pytest.raises(NonFiniteError, match=r"step \d: the gradient norm is nan: the update was not applied"):
        trainer.train()
    saved = checkpoint_dirs(Path(trainer.config.output_dir) / "checkpoints")
    assert saved and all(is_complete(d) for d in saved)
    assert all(torch.isfinite(p).all() for p in trainer.policy.parameters())  # the bad update was never applied


def test_weights_that_are_no_longer_finite_are_never_saved(tmp_path):
    from grouprl.errors import NonFiniteError

    trainer = make_trainer(tmp_path, total_steps=1)
    trainer.train()
    saved = checkpoint_dirs(Path(trainer.config.output_dir) / "checkpoints")
    with torch.no_grad():
        next(trainer.policy.parameters())[0, 0] = float("inf")
    trainer.step_count += 1
    with pytest.raises(NonFiniteError, match="no longer finite: this state is not saved"):
        trainer.save()
    assert checkpoint_dirs(Path(trainer.config.output_dir) / "checkpoints") == saved  # nothing new, nothing lost
