"""An OpenAI-compatible chat endpoint (``POST /v1/chat/completions``) that records, per API key (one trajectory),
every call's prompt ids, sampled ids and log-probs, so an agent is trained on the tokens it was served.
``content`` keeps the text as sampled, tool-call markup included, so the next call renders the same tokens."""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from grouprl.envs.tools import Tool, ToolParser, tools_system_prompt
from grouprl.rollout.agent import ChatRenderer
from grouprl.types import SamplingParams

PATH = "/v1/chat/completions"


@dataclass
class Call:
    """One answered request of a trajectory."""

    prompt_ids: list[int]
    completion_ids: list[int]
    """As sampled, the stop token included."""
    logprobs: list[float]
    messages: list[dict[str, Any]]
    """The request's messages followed by the answer."""
    truncated: bool


class RequestError(Exception):
    """A request the endpoint refuses, with its HTTP status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class ChatEndpoint:
    """Serves ``engine`` on ``127.0.0.1`` inside :meth:`serving`; ``context``: the most tokens of prompt and answer."""

    def __init__(self, engine: Any, tokenizer: Any, params: SamplingParams, parse: ToolParser, context: int,
                 seed: int = 0):
        self.engine, self.tokenizer, self.params, self.parse = engine, tokenizer, params, parse
        self.context, self.seed, self.drawn = context, seed, 0
        self.calls: dict[str, list[Call]] = {}
        self.renderers: dict[str, ChatRenderer] = {}
        self.lock = threading.Lock()
        self.pending: queue.Queue = queue.Queue()
        stop = set(params.stop_token_ids) | ({tokenizer.eos_token_id} - {None})
        self.stop = stop
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
                key = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                    status, out = 200, endpoint.answer(self.path, key, body)
                except RequestError as e:
                    status, out = e.status, {"error": {"message": str(e), "type": "invalid_request_error"}}
                except ValueError as e:
                    status, out = 400, {"error": {"message": f"the body is not JSON: {e}"}}
                data = json.dumps(out).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:  # requests are recorded, not printed
                pass

        self.handler, self.server = Handler, None

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """Listen (on a free port) and sample while inside."""
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler)
        self.server.daemon_threads = True
        threads = [threading.Thread(target=self.server.serve_forever, daemon=True),
                   threading.Thread(target=self._sample_loop, daemon=True)]
        for t in threads:
            t.start()
        try:
            yield
        finally:
            self.server.shutdown()
            self.server.server_close()
            self.pending.put(None)
            threads[1].join()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def open(self, key: str) -> None:
        with self.lock:
            self.calls[key] = []

    def take(self, key: str) -> list[Call]:
        """The calls recorded under ``key``, which is closed from now on (a later request is refused)."""
        with self.lock:
            return self.calls.pop(key, [])

    def answer(self, path: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
        """The chat completion of one request (a :class:`RequestError` when refused)."""
        if path.rstrip("/") != PATH:
            raise RequestError(404, f"only POST {PATH} is served, not {path}")
        with self.lock:
            if key not in self.calls:
                raise RequestError(401, "the API key is not one of this run's open trajectories")
        if body.get("stream"):
            raise RequestError(400, "stream: true is not served; ask without streaming")
        if body.get("n", 1) != 1:
            raise RequestError(400, f"n must be 1 (one trajectory, one answer), not {body.get('n')}")
        messages = _messages(body.get("messages"))
        tools = body.get("tools") or []
        for i, tool in enumerate(tools if isinstance(tools, list) else [None]):
            if not isinstance(tool, dict) or not isinstance((tool.get("function") or {}).get("name"), str):
                raise RequestError(400, f'tools[{i}] is not {{"type": "function", "function": {{"name": ...}}}}')
        try:
            prompt = self._renderer(tools).prompt_ids(messages)
        except Exception as e:  # noqa: BLE001 - jinja and the tokenizer raise many kinds: all are this request's fault
            raise RequestError(400, f"the messages cannot be rendered with the model's chat template: {e}") from e
        if len(prompt) + self.params.max_new_tokens > self.context:
            raise RequestError(400, f"the prompt has {len(prompt)} tokens; with max_new_tokens="
                                    f"{self.params.max_new_tokens} it exceeds the model's {self.context}")
        done: Future = Future()
        self.pending.put((prompt, done))
        ids, logprobs, truncated = done.result()
        return self._record(key, messages, prompt, ids, logprobs, truncated)

    def _renderer(self, tools: list[dict[str, Any]]) -> ChatRenderer:
        sig = json.dumps(tools, sort_keys=True)
        with self.lock:
            if sig not in self.renderers:
                wrapped = [Tool(None, t) for t in tools]  # schemas only: the agent runs its own tools
                self.renderers[sig] = ChatRenderer(self.tokenizer, wrapped, None,
                                                   tools_system_prompt(wrapped) if wrapped else None)
            return self.renderers[sig]

    def _sample_loop(self) -> None:
        """Samples whatever requests wait, in one engine call (each row from its own seed)."""
        while (item := self.pending.get()) is not None:
            batch, stopping = [item], False
            while not self.pending.empty():
                more = self.pending.get()
                stopping = more is None
                if stopping:
                    break
                batch.append(more)
            seeds = list(range(self.seed + self.drawn, self.seed + self.drawn + len(batch)))
            self.drawn += len(batch)
            try:
                out = self.engine.generate([p for p, _ in batch], 1, self.params, seed=seeds)
            except Exception as e:  # noqa: BLE001 - each waiting request gets the failure
                for _, done in batch:
                    done.set_exception(RequestError(500, f"sampling failed: {e}"))
                continue
            for i, (_, done) in enumerate(batch):
                n = int(out.completion_mask[i].sum())
                done.set_result((out.completion_ids[i, :n].tolist(), out.sampling_logprobs[i, :n].tolist(),
                                 bool(out.truncated[i])))
            if stopping:
                return

    def _record(self, key: str, messages: list[dict], prompt: list[int], ids: list[int], logprobs: list[float],
                truncated: bool) -> dict[str, Any]:
        text = self.tokenizer.decode(ids[:-1] if ids and ids[-1] in self.stop else ids, skip_special_tokens=False)
        calls = [c for c in self.parse(text) if c.name is not None and c.error is None]
        tool_calls = [{"id": f"call_{time.monotonic_ns()}_{i}", "type": "function",
                       "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for i, c in enumerate(calls)]
        message = {"role": "assistant", "content": text, **({"tool_calls": tool_calls} if tool_calls else {})}
        with self.lock:
            if key not in self.calls:  # the trajectory ended (timed out) while this call sampled
                raise RequestError(401, "the trajectory of this API key has ended")
            self.calls[key].append(Call(prompt, ids, logprobs, [*messages, message], truncated))
        reason = "length" if truncated else ("tool_calls" if tool_calls else "stop")
        return {"id": f"chatcmpl-{time.monotonic_ns()}", "object": "chat.completion", "created": int(time.time()),
                "model": "policy", "choices": [{"index": 0, "message": message, "finish_reason": reason}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                          "total_tokens": len(prompt) + len(ids)}}


def _messages(raw: Any) -> list[dict[str, Any]]:
    """The request's messages as the chat template takes them, or a 400 naming the message at fault."""
    if not isinstance(raw, list) or not raw:
        raise RequestError(400, "messages must be a non-empty list")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(400, f"messages[{i}] has no role")
        content = m.get("content")
        if isinstance(content, Sequence) and not isinstance(content, str):
            if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
                raise RequestError(400, f"messages[{i}]: only text content parts are served")
            content = "".join(p.get("text", "") for p in content)
        message = {**m, "content": content or ""}
        if m.get("tool_calls"):
            message["tool_calls"] = [_call_with_object(c) for c in m["tool_calls"]]
        out.append(message)
    return out


def _call_with_object(call: dict[str, Any]) -> dict[str, Any]:
    """``call`` whose JSON-string arguments are an object (how chat templates print them)."""
    fn = dict(call.get("function") or {})
    if isinstance(fn.get("arguments"), str):
        with contextlib.suppress(ValueError):  # not JSON: the template prints it as given
            fn["arguments"] = json.loads(fn["arguments"])
    return {**call, "function": fn}
