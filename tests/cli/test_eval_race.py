"""``grouprl eval`` of a run folder that is still training: a checkpoint removed while eval reads it
(keep_checkpoints 1) is replaced by the newest one, and eval says so."""

from __future__ import annotations

import pytest
import torch

from grouprl.cli import build
from grouprl.errors import ModelLoadError
from grouprl.models import tiny_causal_lm
from grouprl.run.checkpoint_files import save_checkpoint


def save(root, step, keep=2):
    model, tok = tiny_causal_lm(seed=step)
    save_checkpoint(root, step, policy=model, state={}, tokenizer=tok, keep=keep)
    return model


def test_a_checkpoint_removed_while_eval_reads_it_is_replaced_by_the_newest(tmp_path, monkeypatch):
    root = tmp_path / "run" / "checkpoints"
    save(root, 1)
    save(root, 2)
    real = build.load_model
    calls = []

    def training_moves_on(spec, seed):  # as eval opens step 2, training saves step 3 and keeps only it
        calls.append(spec)
        if len(calls) == 1:
            newest.append(save(root, 3, keep=1))
        return real(spec, seed)

    newest = []
    monkeypatch.setattr(build, "load_model", training_moves_on)
    said = []
    model, _ = build.load_newest_model(str(tmp_path / "run"), 0, said.append)
    assert [c.split("/")[-2] for c in calls] == ["step-000002", "step-000003"]
    assert said == ["step-000002 was removed by the training run while it was being read (ModelLoadError); "
                    "picking the newest checkpoint again"]
    for name, value in newest[0].state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name  # the weights of step 3


def test_checkpoints_removed_every_time_end_in_a_message_that_says_so(tmp_path, monkeypatch):
    root = tmp_path / "run" / "checkpoints"
    save(root, 1)
    step = [1]

    def always_gone(spec, seed):
        step[0] += 1
        save(root, step[0], keep=1)  # each pick is replaced before it is read
        return build.load_model.__wrapped__(spec, seed)

    always_gone.__wrapped__ = build.load_model
    monkeypatch.setattr(build, "load_model", always_gone)
    with pytest.raises(ModelLoadError, match=f"removed each of the last {build.EVAL_PICKS} checkpoints picked"):
        build.load_newest_model(str(tmp_path / "run"), 0, lambda line: None)


def test_any_other_failure_is_raised_as_it_is(tmp_path, monkeypatch):
    root = tmp_path / "run" / "checkpoints"
    save(root, 1)

    def broken(spec, seed):
        raise ModelLoadError("a broken model folder")

    monkeypatch.setattr(build, "load_model", broken)
    with pytest.raises(ModelLoadError, match="a broken model folder"):
        build.load_newest_model(str(tmp_path / "run"), 0, lambda line: pytest.fail(line))
