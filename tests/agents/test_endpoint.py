"""The chat endpoint on a scripted engine: keys, refusals, tool calls, what it records, concurrent calls; and how
recorded calls become samples."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
import torch

from grouprl.envs.tools import parse_hermes
from grouprl.models import tiny_tokenizer
from grouprl.trainer.agent_runs import samples
from grouprl.trainer.chat_endpoint import Call, ChatEndpoint
from grouprl.types import RolloutBatch, SamplingParams
from tests.helpers.own_agents import TOOLS

CALL = '<tool_call>{"name": "double", "arguments": {"x": 3}}</tool_call>'


class ScriptedEngine:
    """Answers a prompt that holds a tool result with ``done``, any other with a tool call; every token's
    log-prob is -0.5. Records each engine call's prompts."""

    def __init__(self, tok):
        self.tok, self.prompts = tok, []

    def generate(self, prompt_ids, group_size, params, *, seed=None):
        self.prompts.append(prompt_ids)
        texts = ["done" if "6" in self.tok.decode(p) else CALL for p in prompt_ids]
        rows = [self.tok(t, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id] for t in texts]
        width = max(map(len, rows))
        ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
        mask = torch.tensor([[1.0] * len(r) + [0.0] * (width - len(r)) for r in rows])
        return RolloutBatch(prompt_ids=torch.zeros(len(rows), 1, dtype=torch.long),
                            prompt_mask=torch.ones(len(rows), 1, dtype=torch.long), completion_ids=ids,
                            completion_mask=mask, sampling_logprobs=-0.5 * mask,
                            truncated=torch.zeros(len(rows), dtype=torch.bool), completions=texts, prompts=[None] * 2,
                            group_size=1)


@pytest.fixture
def endpoint():
    tok = tiny_tokenizer()
    engine = ScriptedEngine(tok)
    point = ChatEndpoint(engine, tok, SamplingParams(max_new_tokens=64), parse_hermes, context=1024)
    with point.serving():
        yield point


def ask(endpoint, key, **body):
    return httpx.post(endpoint.base_url + "/chat/completions", headers={"Authorization": f"Bearer {key}"},
                      json={"model": "policy", "messages": [{"role": "user", "content": "hi"}], **body})


def test_a_request_without_an_open_key_is_refused(endpoint):
    endpoint.open("k1")
    assert ask(endpoint, "k2").status_code == 401
    assert httpx.post(endpoint.base_url + "/chat/completions", json={"messages": []}).status_code == 401
    assert ask(endpoint, "k1").status_code == 200
    endpoint.take("k1")
    assert ask(endpoint, "k1").status_code == 401  # a trajectory that ended takes no more calls
    assert endpoint.engine.prompts and len(endpoint.engine.prompts) == 1


def test_streaming_and_bad_messages_are_400_naming_why(endpoint):
    endpoint.open("k")
    streamed = ask(endpoint, "k", stream=True)
    assert streamed.status_code == 400 and "stream" in streamed.json()["error"]["message"]
    bad = ask(endpoint, "k", messages=[{"content": "no role"}])
    assert bad.status_code == 400 and "messages[0]" in bad.json()["error"]["message"]
    no_schema = ask(endpoint, "k", tools=[TOOLS[0], {"type": "function"}])
    assert no_schema.status_code == 400 and "tools[1] is not" in no_schema.json()["error"]["message"]
    unrenderable = ask(endpoint, "k", messages=[{"role": "user", "content": {"not": "text"}}])
    assert unrenderable.status_code == 400 and "chat template" in unrenderable.json()["error"]["message"]
    assert endpoint.take("k") == []


def test_tool_calls_come_back_in_openai_fields_and_the_tokens_are_recorded(endpoint):
    tok = endpoint.tokenizer
    endpoint.open("k")
    client = openai.OpenAI(base_url=endpoint.base_url, api_key="k", max_retries=0)
    messages = [{"role": "user", "content": "double 3?"}]
    first = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls"
    assert (call.function.name, json.loads(call.function.arguments)) == ("double", {"x": 3})
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "6"}]
    second = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    assert second.choices[0].message.content == "done" and second.choices[0].message.tool_calls is None
    calls = endpoint.take("k")
    assert len(calls) == 2
    assert calls[0].completion_ids == tok(CALL, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert calls[0].logprobs == [-0.5] * len(calls[0].completion_ids)
    assert calls[0].prompt_ids == endpoint.engine.prompts[0][0]
    # the second prompt extends the first call's prompt and answer: one sequence, the tool's reply as context
    (sample,) = samples(calls)
    assert sample.prompt == calls[0].prompt_ids
    assert sample.tokens == calls[1].prompt_ids[len(calls[0].prompt_ids):] + calls[1].completion_ids
    n0 = len(calls[0].completion_ids)
    gap = len(calls[1].prompt_ids) - len(calls[0].prompt_ids) - n0
    assert sample.from_policy == [True] * n0 + [False] * gap + [True] * len(calls[1].completion_ids)
    assert "6" in tok.decode(sample.tokens[n0:n0 + gap]) and "double" in tok.decode(sample.prompt)  # tools shown


def test_eight_agents_at_once_each_get_their_own_answers(endpoint):
    keys = [f"k{i}" for i in range(8)]
    for key in keys:
        endpoint.open(key)

    async def one(key, i):
        async with openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=key, max_retries=0) as client:
            said = "6" if i % 2 else "x"
            reply = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": said}])
            return reply.choices[0].message.content

    async def all_of_them():
        return await asyncio.gather(*(one(k, i) for i, k in enumerate(keys)))

    answers = asyncio.run(all_of_them())
    assert answers == [CALL, "done"] * 4
    calls = [endpoint.take(k) for k in keys]
    assert [len(c) for c in calls] == [1] * 8
    assert [endpoint.tokenizer.decode(c[0].completion_ids[:-1]) for c in calls] == answers
    assert sum(len(p) for p in endpoint.engine.prompts) == 8  # every request sampled once, some together


def test_a_call_that_does_not_extend_the_last_starts_another_sample():
    def call(prompt, completion):
        return Call(prompt, completion, [-1.0] * len(completion), [], False)

    calls = [call([1, 2], [3, 4]), call([1, 2, 3, 4, 9], [5]), call([1, 7], [8]), call([1, 7, 8, 6], [2])]
    first, second = samples(calls)
    assert (first.prompt, first.tokens, first.from_policy) == ([1, 2], [3, 4, 9, 5], [True, True, False, True])
    assert (second.prompt, second.tokens, second.from_policy) == ([1, 7], [8, 6, 2], [True, False, True])
    assert second.logprobs == [-1.0, 0.0, -1.0]
