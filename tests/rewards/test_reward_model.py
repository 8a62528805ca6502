"""Reward models: scoring through the chat template, and Bradley-Terry training on synthetic pairs."""

import json
import random

import pytest
import torch
from transformers import LlamaForSequenceClassification

from grouprl.errors import ConfigError, DataError
from grouprl.models import tiny_llama_config, tiny_tokenizer
from grouprl.rewards import RewardModel, score_rewards, train_reward_model
from grouprl.rewards.reward_model import (
    SAVED_MARKER,
    bradley_terry_loss,
    check_replaceable,
    load_pairs,
    render_conversation,
    save_pretrained_atomic,
)


def tiny_reward_model(seed=0, hidden_size=32):
    tok = tiny_tokenizer()
    torch.manual_seed(seed)
    model = LlamaForSequenceClassification(tiny_llama_config(tok, hidden_size=hidden_size, num_layers=1, num_heads=2,
                                                             num_kv_heads=1, num_labels=1))
    return model, tok


def synthetic_pairs(n, seed):
    """Preference that a tiny model can learn: the chosen reply says 'yes', the rejected one 'no',
    each buried in random letters."""
    rng = random.Random(seed)

    def noise():
        return "".join(rng.choice("abcdefgh ") for _ in range(rng.randint(3, 10)))

    return [{"prompt": f"Question {rng.randint(0, 99)}?", "chosen": f"{noise()} yes {noise()}",
             "rejected": f"{noise()} no {noise()}"} for _ in range(n)]


def test_bradley_terry_loss_by_hand():
    # margins 0, 1, -1: -log sigmoid(0) = 0.693147, -log sigmoid(1) = 0.313262, -log sigmoid(-1) = 1.313262
    loss = bradley_terry_loss(torch.tensor([1.0, 2.0, 0.0]), torch.tensor([1.0, 1.0, 1.0]))
    assert loss.item() == pytest.approx((0.693147 + 0.313262 + 1.313262) / 3, abs=1e-5)


def test_scores_read_the_chat_rendered_conversation_and_do_not_depend_on_batching():
    model, tok = tiny_reward_model()
    prompts = ["Hi?", [{"role": "user", "content": "A much longer question, padded in a batch?"}], "Short"]
    completions = ["Hello there", "yes", "a reply that is rather long indeed"]
    one_by_one = RewardModel(model, tok, batch_size=1)(prompts, completions)
    batched = RewardModel(model, tok, batch_size=3)(prompts, completions)
    assert batched == pytest.approx(one_by_one, abs=1e-5)
    text = render_conversation(tok, "Hi?", "Hello there", system_prompt="Be kind.")
    assert text == "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n" \
                   "<|im_start|>assistant\nHello there<|im_end|>\n"
    ids = tok(render_conversation(tok, "Hi?", "Hello there"), add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        assert one_by_one[0] == pytest.approx(model(**ids).logits[0, 0].item(), abs=1e-6)


def test_reward_model_in_a_reward_list():
    model, tok = tiny_reward_model()
    rm = RewardModel(model, tok, batch_size=2)
    scores = score_rewards([rm], [0.5], ["q"] * 3, ["a", "b", "c"], columns={"answer": [1, 2, 3]})
    assert list(scores.per_fn) == ["reward_model"]
    assert scores.total.tolist() == pytest.approx([0.5 * s for s in rm(["q"] * 3, ["a", "b", "c"])])


def test_training_learns_a_held_out_preference_and_saves_a_loadable_model(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in synthetic_pairs(96, seed=1)))
    held_out = synthetic_pairs(40, seed=2)
    model, tok = tiny_reward_model()
    result = train_reward_model(model, tok, path, eval_pairs=held_out, epochs=3, batch_size=16, lr=3e-3,
                                output_dir=tmp_path / "rm")
    assert result.eval_accuracy >= 0.9, result.history  # chance is 0.5
    assert result.history[0]["train_loss"] > result.train_loss and result.train_loss < 0.3
    assert result.history[0]["eval_loss"] > result.eval_loss

    loaded = RewardModel(tmp_path / "rm", batch_size=8)
    chosen = loaded([p["prompt"] for p in held_out], [p["chosen"] for p in held_out])
    rejected = loaded([p["prompt"] for p in held_out], [p["rejected"] for p in held_out])
    assert sum(c > r for c, r in zip(chosen, rejected)) / len(held_out) == result.eval_accuracy


def test_held_out_split_from_the_pairs_and_errors(tmp_path):
    model, tok = tiny_reward_model()
    result = train_reward_model(model, tok, synthetic_pairs(20, seed=3), eval_fraction=0.25, epochs=1)
    assert result.eval_accuracy is not None and result.output_dir is None
    with pytest.raises(ValueError, match=r"pair 1 lacks \['rejected'\]; it has columns \['prompt', 'chosen'\]"):
        load_pairs([{"prompt": "p", "chosen": "a", "rejected": "b"}, {"prompt": "p", "chosen": "a"}])
    with pytest.raises(ValueError, match="no preference pairs"):
        load_pairs([])
    with pytest.raises(FileNotFoundError, match="reward model folder"):
        RewardModel(tmp_path / "missing")
    with pytest.raises(ValueError, match="num_labels=1"):
        RewardModel(LlamaForSequenceClassification(tiny_llama_config(tok, num_labels=2)), tok)


def test_bad_pairs_are_named_by_row_before_any_training():
    good = {"prompt": "p", "chosen": "a", "rejected": "b"}
    with pytest.raises(DataError, match=r"preference pair 1: 'chosen' must be text, got list"):
        load_pairs([good, {**good, "chosen": ["a"]}])
    with pytest.raises(DataError, match="1"):
        load_pairs([good, {**good, "prompt": 7}])
    with pytest.warns(UserWarning, match="every one of the 2 preference pairs has chosen == rejected"):
        load_pairs([{**good, "rejected": "a"}] * 2)
    model, tok = tiny_reward_model()
    with pytest.raises(ValueError, match=r"1 preference pair\(s\) in all, and eval_fraction=0.5 holds them out"):
        train_reward_model(model, tok, [good], eval_fraction=0.5, epochs=1)


def test_a_save_replaces_only_a_folder_an_earlier_save_wrote(tmp_path):
    model, tok = tiny_reward_model()
    out = tmp_path / "rm"
    save_pretrained_atomic(model, tok, out)
    written = json.loads((out / SAVED_MARKER).read_text())["files"]
    assert "model.safetensors" in written and "config.json" in written
    save_pretrained_atomic(model, tok, out)  # its own earlier save: replaced whole
    assert RewardModel(out, batch_size=2)(["q"], ["a"])

    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"holds files this command did not write \(notes.txt\)"):
        save_pretrained_atomic(model, tok, out)
    assert (out / "notes.txt").read_text() == "mine"

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError, match="metrics.jsonl"):
        check_replaceable(run)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        check_replaceable(tmp_path / "file")
    check_replaceable(tmp_path / "absent")
