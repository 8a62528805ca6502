"""How conversations become tokens: tools through a template that takes ``tools=`` or, for one that
ignores it, through the system message; and the tokens that join a policy turn to the next reply."""

from __future__ import annotations

from grouprl.envs.tools import Tool, tools_system_prompt
from grouprl.rollout.agent import ChatRenderer
from tests.envs.test_tools import add
from tests.helpers.rollout import CHAT_TEMPLATE, make_tokenizer

TOOLS_TEMPLATE = ("{% if tools %}tools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}"
                  "{{ '\\n' }}{% endif %}" + CHAT_TEMPLATE)
"""A template that renders the tools it is given, as Qwen's and Llama 3's do."""


def test_a_template_that_takes_tools_gets_them_and_the_system_message_stays_the_users():
    tok = make_tokenizer()
    tok.chat_template = TOOLS_TEMPLATE
    tools = [Tool.of(add)]
    renderer = ChatRenderer(tok, tools, system_prompt="Be brief.", tools_prompt=tools_system_prompt(tools))
    assert renderer.tools == [tools[0].schema] and renderer.system == "Be brief."
    text = tok.decode(renderer.prompt_ids([{"role": "user", "content": "1+2?"}]))
    assert text == "tools: add\nsystem: Be brief.\nuser: 1+2?\nassistant: "
    # the reply after a policy turn: the end of that turn and the tool's answer, then the next prompt
    history = [{"role": "user", "content": "1+2?"}, {"role": "assistant", "content": "call"}]
    tail = renderer.reply_ids(history, [{"role": "tool", "content": "3"}], stop_text=None)
    assert tok.decode(tail) == "\ntool: 3\nassistant: "


def test_a_template_that_ignores_tools_gets_them_described_in_the_system_message():
    tok = make_tokenizer()
    tools = [Tool.of(add)]
    renderer = ChatRenderer(tok, tools, system_prompt="Be brief.", tools_prompt=tools_system_prompt(tools))
    assert renderer.tools is None
    assert renderer.system == "Be brief.\n\n" + tools_system_prompt(tools)
    text = tok.decode(renderer.prompt_ids([{"role": "user", "content": "1+2?"}]))
    assert text.startswith("system: Be brief.\n\nYou can call these tools:") and '"name": "add"' in text
    # a conversation that brings its own system message keeps it, tools or not
    own = renderer.with_system([{"role": "system", "content": "mine"}, {"role": "user", "content": "q"}])
    assert own[0] == {"role": "system", "content": "mine"} and len(own) == 2
    # no tools, no system prompt: nothing is added
    assert ChatRenderer(tok).system is None
