"""What a rollout server's answer becomes on the trainer's side (grouprl.serve.client.server_sampler.parse_completion):
a completion with its tokens, log-probs and policy version, and hostile answers refused naming the server."""

from __future__ import annotations

import pytest

from grouprl.serve.client.server_sampler import parse_completion
from grouprl.serve.client.servers import RolloutServerError


def answer(token_ids, logprobs, spans=(("3", 0, 2),), finish="stop"):
    content = [{"token_id": t, "logprob": lp} for t, lp in zip(token_ids, logprobs)]
    return {"choices": [{"token_ids": token_ids, "logprobs": {"content": content}, "finish_reason": finish,
                         "weight_versions": [{"version": v, "start": a, "end": b} for v, a, b in spans]}]}


def test_a_servers_answer_becomes_a_completion_with_its_policy_version():
    c = parse_completion(answer([5, 9], [-0.5, -1.25]), "h:1")
    assert c.token_ids == [5, 9] and [e[t].logprob for e, t in zip(c.logprobs, c.token_ids)] == [-0.5, -1.25]
    assert c.version == 3 and c.finish_reason == "stop"
    # drawn across a weight load: the oldest version counts (the staleness of the whole completion)
    assert parse_completion(answer([5, 9], [-0.5, -1.0], spans=(("4", 0, 1), ("5", 1, 2))), "h:1").version == 4
    assert parse_completion(answer([5], [-0.5], spans=(("default", 0, 1),)), "h:1").version is None  # before a push


@pytest.mark.parametrize("bad", [
    {},
    {"choices": []},
    {"choices": [{"token_ids": ["x"], "logprobs": {"content": [{"logprob": 0.0}]}}]},
    {"choices": [{"token_ids": [1], "logprobs": {"content": [{"logprob": "nan?"}]}}]},
    {"choices": [{"token_ids": [1, 2], "logprobs": {"content": [{"logprob": -1.0}]}}]},
    "not a dict",
])
def test_an_answer_of_another_shape_is_an_error_naming_the_server(bad):
    with pytest.raises(RolloutServerError, match="rollout server h:1"):
        parse_completion(bad, "h:1")
