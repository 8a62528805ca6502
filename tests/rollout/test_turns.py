"""Multi-turn decoding on one KV cache: the same log-probs and the same greedy trajectories as
re-encoding the conversation every turn, budgets, and environment tokens that carry no gradient."""

from __future__ import annotations

import pytest
import torch

from grouprl.algos import grpo_loss
from grouprl.rollout.logprobs import token_logprobs
from grouprl.rollout.runner import Runner, left_pad
from grouprl.rollout.turns import Reply, TurnLimits, decode_conversations
from grouprl.types import SamplingParams
from tests.helpers.messages import named
from tests.helpers.rollout import encode, make_model

REPLIES = ["ok, go on\nassistant: ", "and again\nassistant: "]
"""What the scripted environment answers after the policy's first and second turns; then it ends."""


def scripted(tok, vary=True):
    """A respond callback: a fixed reply per turn (of different lengths for odd rows when ``vary``, so
    replies are padded), then the end."""
    seen: dict[int, int] = {}

    def respond(rows, turns, stopped):
        out = []
        for row in rows:
            k = seen.get(row, 0)
            seen[row] = k + 1
            text = REPLIES[k] * (1 + vary * (row % 2)) if k < len(REPLIES) else None
            out.append(Reply(None) if text is None else Reply(encode(tok, [text])[0]))
        return out

    return respond


def decode(model, tok, prompts, g, temperature=1.0, limits=None, seeds=None, vary=True):
    limits = limits or TurnLimits(6, 5, 200)
    ids, mask = left_pad(encode(tok, prompts), tok.pad_token_id, torch.device("cpu"))
    params = SamplingParams(max_new_tokens=limits.max_new_tokens, temperature=temperature)
    with torch.inference_mode():
        return ids, mask, decode_conversations(model, ids, mask, g, params, limits, scripted(tok, vary),
                                               seeds or list(range(len(prompts) * g)),
                                               torch.tensor([tok.eos_token_id]), tok.pad_token_id)


def as_tensors(out, pad):
    width = max(len(t) for t in out.tokens)
    ids = torch.full((len(out.tokens), width), pad)
    policy, seq, logp = (torch.zeros(len(out.tokens), width) for _ in range(3))
    for i, t in enumerate(out.tokens):
        ids[i, : len(t)] = torch.tensor(t)
        policy[i, : len(t)] = torch.tensor(out.from_policy[i], dtype=torch.float32)
        seq[i, : len(t)] = 1
        logp[i, : len(t)] = torch.tensor(out.logprobs[i])
    return ids, policy, seq, logp


@pytest.mark.parametrize("packed", [False, True])
def test_continuing_the_cache_gives_the_log_probs_of_re_encoding_the_conversation(tok, packed):
    model = make_model(tok, head_scale=3.0)
    prompt_ids, prompt_mask, out = decode(model, tok, ["Hi", "What is 7+5?"], g=3)
    assert all(t == 3 for t in out.turns) and all(r == "env" for r in out.end_reason)  # every reply was shown
    ids, policy, seq, logp = as_tensors(out, tok.pad_token_id)
    assert policy.sum() < seq.sum()  # environment tokens in between
    with torch.no_grad():
        again, _ = token_logprobs(model, prompt_ids.repeat_interleave(3, 0), prompt_mask.repeat_interleave(3, 0),
                                  ids, policy, packed=packed, sequence_mask=seq)
    torch.testing.assert_close(again, logp, atol=1e-4, rtol=0)


def greedy_by_re_encoding(model, tok, prompt, reply_rows, max_new):
    """The baseline: every token from a forward over the whole conversation so far."""
    seq, out = encode(tok, [prompt])[0], []
    for reply in reply_rows:
        for _ in range(max_new):
            with torch.no_grad():
                nxt = int(model(torch.tensor([seq])).logits[0, -1].argmax())
            seq.append(nxt)
            out.append(nxt)
            if nxt == tok.eos_token_id:
                break
        if reply is None:
            return out
        seq.extend(reply)
        out.extend(reply)
    return out


def test_greedy_trajectories_equal_re_encoding_every_turn(tok):
    model = make_model(tok, head_scale=3.0)
    _, _, out = decode(model, tok, ["Hi", "What is 7+5?"], g=2, temperature=0.0)
    for row, prompt in enumerate(["Hi", "Hi", "What is 7+5?", "What is 7+5?"]):
        replies = [encode(tok, [r * (1 + row % 2)])[0] for r in REPLIES] + [None]
        assert out.tokens[row] == greedy_by_re_encoding(model, tok, prompt, replies, 6), row


def test_budgets_end_trajectories_with_their_reason(tok):
    model = make_model(tok)
    _, _, by_turns = decode(model, tok, ["Hi"], g=2, limits=TurnLimits(4, 2, 500))
    assert by_turns.turns == [2, 2] and by_turns.end_reason == ["turns", "turns"] and all(by_turns.truncated)
    _, _, by_length = decode(model, tok, ["Hi"], g=2, limits=TurnLimits(4, 5, 12))
    assert by_length.end_reason == ["length", "length"]
    assert all(len(t) <= 12 for t in by_length.tokens)
    # a row's draws depend on its seed alone, not on the rows beside it
    _, _, pair = decode(model, tok, ["Hi"], g=2, limits=TurnLimits(4, 2, 500), vary=False)
    _, _, alone = decode(model, tok, ["Hi"], g=1, seeds=[1], limits=TurnLimits(4, 2, 500), vary=False)
    assert alone.tokens[0] == pair.tokens[1] != pair.tokens[0]


def test_environment_tokens_get_exactly_zero_gradient(tok):
    model = make_model(tok, head_scale=3.0)
    prompt_ids, prompt_mask, out = decode(model, tok, ["Hi"], g=2)
    ids, policy, seq, _ = as_tensors(out, tok.pad_token_id)
    p_ids, p_mask = prompt_ids.repeat_interleave(2, 0), prompt_mask.repeat_interleave(2, 0)
    full = torch.cat([p_ids, ids], 1)
    logits = model(full, attention_mask=torch.cat([p_mask, torch.ones_like(ids)], 1)).logits[:, p_ids.shape[1] - 1:-1]
    logits.retain_grad()  # [B, T, V]: position t predicts completion token t
    logp = torch.log_softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    entropy = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    loss, _ = grpo_loss(logp, None, logp.detach() - 0.1, torch.tensor([1.0, -1.0]), policy, beta=0.3, entropy=entropy,
                        entropy_coef=0.05)
    loss.backward()
    per_token = logits.grad.abs().sum(-1)  # [B, T]
    assert torch.equal(per_token[(seq > 0) & (policy == 0)], torch.zeros(int(((seq > 0) & (policy == 0)).sum())))
    assert (per_token[policy > 0] > 0).all()


def test_a_trajectory_trains_its_turns_as_single_turn_samples_of_the_same_tokens(tok):
    """The gradient of sum_t A_t log pi(o_t) over a two-turn trajectory is the sum of the gradients of
    two one-turn samples: prompt -> turn 1, and (prompt, turn 1, reply) -> turn 2."""
    model = make_model(tok, head_scale=3.0)
    prompt_ids, prompt_mask, out = decode(model, tok, ["Hi"], g=1, limits=TurnLimits(6, 2, 200))
    tokens, policy = out.tokens[0], out.from_policy[0]
    first_end = policy.index(False)
    second = first_end + policy[first_end:].index(True)
    prompt = encode(tok, ["Hi"])[0]
    weights = torch.linspace(-1, 1, len(tokens))

    def grad_of(loss_fn):
        model.zero_grad()
        loss_fn().backward()
        return {k: p.grad.clone() for k, p in model.named_parameters()}

    def trajectory_loss():
        ids, pol, seq, _ = as_tensors(out, tok.pad_token_id)
        logp, _ = token_logprobs(model, prompt_ids, prompt_mask, ids, pol, sequence_mask=seq, packed=True)
        return -(logp[0] * weights).sum()

    def turns_loss():
        total = 0
        for start, stop, context in ((0, first_end, prompt), (second, len(tokens), prompt + tokens[:second])):
            c_ids = torch.tensor([tokens[start:stop]])
            logp, _ = token_logprobs(model, torch.tensor([context]), torch.ones(1, len(context), dtype=torch.long),
                                     c_ids, torch.ones_like(c_ids, dtype=torch.float32))
            total = total - (logp[0] * weights[start:stop]).sum()
        return total

    a, b = grad_of(trajectory_loss), grad_of(turns_loss)
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-4, msg=named(k))


def test_passengers_keep_the_compiled_rows_and_change_nothing(tok, monkeypatch):
    """With 3 rows to keep (a compiled step needs 2; 3 shows the padding over more steps), ended trajectories
    ride along beside the last ones: the same trajectories, and ``respond`` never sees a passenger."""
    model = make_model(tok)
    limits = TurnLimits(6, 5, 200)
    ids, mask = left_pad(encode(tok, ["Hi", "Say something"]), tok.pad_token_id, torch.device("cpu"))
    params = SamplingParams(max_new_tokens=limits.max_new_tokens, temperature=1.0)

    def run():
        shown, steps, seen = [], [], {}

        def respond(rows, turns, stopped):  # row r's trajectory ends after r % 4 + 1 turns
            shown.append(list(rows))
            out = []
            for row in rows:
                k = seen[row] = seen.get(row, -1) + 1
                out.append(Reply(None) if k >= row % 4 else Reply(encode(tok, [REPLIES[k % 2]])[0]))
            return out

        forward = Runner.forward

        def spy(self, step_ids, step_mask, positions):
            if step_ids.shape[1] == 1:
                steps.append(step_ids.shape[0])
            return forward(self, step_ids, step_mask, positions)

        with monkeypatch.context() as m, torch.inference_mode():
            m.setattr(Runner, "forward", spy)
            out = decode_conversations(model, ids, mask, 4, params, limits, respond, list(range(8)),
                                       torch.tensor([tok.eos_token_id]), tok.pad_token_id)
        return out, shown, steps

    plain, plain_shown, plain_steps = run()
    assert plain.turns == [1, 2, 3, 4] * 2 and min(plain_steps) == 2  # the last turn runs rows 3 and 7 alone
    monkeypatch.setattr(Runner, "fewest_rows", property(lambda self: 3))
    padded, padded_shown, padded_steps = run()
    assert min(padded_steps) == 3
    assert padded_shown == plain_shown
    assert padded.tokens == plain.tokens and padded.from_policy == plain.from_policy
    assert padded.turns == plain.turns and padded.end_reason == plain.end_reason
    for a, b in zip(padded.logprobs, plain.logprobs, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
