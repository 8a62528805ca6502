"""An agent as you would write it for any OpenAI-compatible server: it answers multiplication questions, calling
a multiply tool. grouprl hands it a client whose base_url is the run's chat endpoint and trains the model on the
tokens it was served; the returned float is the trajectory's reward."""

import json

from openai import AsyncOpenAI

TOOLS = [{
    "type": "function",
    "function": {
        "name": "multiply",
        "description": "Multiply two numbers.",
        "parameters": {"type": "object", "required": ["a", "b"],
                       "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
    },
}]


def multiply(arguments: str) -> str:
    try:
        args = json.loads(arguments)
        return str(float(args["a"]) * float(args["b"]))
    except (ValueError, KeyError, TypeError) as e:
        return f"error: {e}"


async def solve(client: AsyncOpenAI, row: dict) -> float:
    messages = [{"role": "system", "content": "Use the multiply tool, then reply with the number alone."},
                {"role": "user", "content": row["prompt"]}]
    for _ in range(3):  # call the tool, read its result, answer
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": multiply(call.function.arguments)})
    answer = (message.content or "").strip().removesuffix(".0")
    return 1.0 if answer == row["answer"] else 0.1 * (row["answer"] in answer)
