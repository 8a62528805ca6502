"""Agents as users write them, with the ``openai`` package only, and a trainer factory that trains one."""

from __future__ import annotations

import asyncio
import json
import string
import time

import torch

from grouprl.models import tiny_causal_lm
from grouprl.trainer.inputs import RunInputs
from grouprl.trainer.trainer import Trainer
from tests.helpers.trainer import base_config

TOOLS = [{"type": "function", "function": {"name": name, "description": f"The {name} of a number.",
                                           "parameters": {"type": "object", "properties": {"x": {"type": "number"}},
                                                          "required": ["x"]}}}
         for name in ("double", "square")]


def run_tool(call) -> str:
    x = json.loads(call.function.arguments).get("x", 0)
    return str(2 * x if call.function.name == "double" else x * x)


async def tool_agent(client, row):
    """Three turns with two tools: each answer's tool calls are run, or the next turn asks again; the reward is the
    share of digits in the last answer."""
    messages = [{"role": "user", "content": f"What is double {row['x']}?"}]
    for _ in range(3):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": run_tool(call)})
        if not message.tool_calls:
            messages.append({"role": "user", "content": "Again, with a number."})
    text = message.content or ""
    return sum(ch.isdigit() for ch in text) / max(len(text), 1)


def rewriting_agent(client, row):
    """A plain function that, after its first answer, asks again with a rewritten history (its first answer
    summarised): the second call does not extend the first."""
    first = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "Say a number."}])
    said = first.choices[0].message.content or ""
    messages = [{"role": "user", "content": "Say a number."}, {"role": "assistant", "content": f"[{len(said)} chars]"},
                {"role": "user", "content": "Another."}]
    second = client.chat.completions.create(model="policy", messages=messages)
    return float(len(second.choices[0].message.content or "") % 3)


async def last_answer_agent(client, row):
    """Two turns; returns None, so the run's reward functions score the last answer."""
    messages = [{"role": "user", "content": row["prompt"]}]
    for _ in range(2):
        reply = await client.chat.completions.create(model="policy", messages=messages)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                     {"role": "user", "content": "More."}]
    return None


async def raising_agent(client, row):
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    if row["x"] % 2:
        raise RuntimeError(f"odd row {row['x']}")
    return 1.0 * row["x"]


async def hanging_agent(client, row):
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    if row["x"] == 1:
        await asyncio.sleep(3600)
    return float(row["x"])


def hanging_plain_agent(client, row):
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    if row["x"] == 1:
        time.sleep(3600)  # a thread cannot be stopped: it is left behind, its key closed
    return float(row["x"])


async def silent_agent(client, row):
    """Calls the model except on row 1."""
    if row["x"] != 1:
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    return 0.5


def policy_turns(batch, row: int) -> list[list[int]]:
    """The runs of the policy's tokens in ``row`` of ``batch`` (its turns, the context between them left out)."""
    turns, current = [], []
    n = int(batch.token_mask[row].sum())
    for token, mine in zip(batch.completion_ids[row, :n].tolist(), (batch.completion_mask[row, :n] > 0).tolist()):
        if mine:
            current.append(token)
        elif current:
            turns, current = [*turns, current], []
    return [*turns, current] if current else turns


def digits(prompts, completions, **_):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def plain_text_model(seed: int = 0):
    """The tiny model and tokenizer, its head biased so it writes printable ASCII and its end-of-turn token only: its
    answers come back through the chat template as the tokens it sampled (a random byte may be half a character)."""
    model, tok = tiny_causal_lm(seed=seed, max_positions=1024)
    embed = model.get_input_embeddings().weight
    head = torch.nn.Linear(embed.shape[1], embed.shape[0], bias=True)
    head.weight = embed
    allowed = [i for i in range(len(tok)) if i == tok.eos_token_id or (len(s := tok.decode([i])) == 1 and
                                                                       s in string.printable and s.isprintable())]
    bias = torch.full((embed.shape[0],), -30.0)
    bias[allowed] = 0.0
    head.bias = torch.nn.Parameter(bias, requires_grad=False)
    model.lm_head = head
    return model, tok


def make_agent_run(tmp_path, agent, rows=4, reward_fns=(), sampler=None, **overrides) -> Trainer:
    """A trainer of :func:`plain_text_model` on ``agent`` over ``rows`` task rows (``x``: 0..rows-1, a prompt
    each)."""
    torch.manual_seed(0)
    model, tok = plain_text_model()
    settings = {"max_new_tokens": 8, "eval_every": 0, "agent_timeout": 60.0, **overrides}
    inputs = RunInputs(train_rows=[{"x": i, "prompt": f"Count {i}"} for i in range(rows)], reward_fns=list(reward_fns),
                       agent=agent)
    return Trainer(base_config(tmp_path, **settings), policy=model, tokenizer=tok, inputs=inputs, sampler=sampler)
