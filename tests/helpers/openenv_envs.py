"""OpenEnv environments for the adapter's tests, and an OpenEnv server of one of them in a thread."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn
from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class TalkAction(Action):
    message: str


class TalkObservation(Observation):
    prompt: str = ""
    turn: int = 0


class DigitTalk(Environment):
    """Two turns, each paying the share of digits in the policy's reply; the reset names its seed and ``level``
    (a row column it takes)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, turns: int = 2):
        super().__init__()
        self.turns, self.n = turns, 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, level: int = 0) -> TalkObservation:
        self.n = 0
        return TalkObservation(prompt=f"game {seed} level {level}: digits")

    def step(self, action: TalkAction, timeout_s: float | None = None, **kwargs: Any) -> TalkObservation:
        self.n += 1
        share = sum(ch.isdigit() for ch in action.message) / max(len(action.message), 1)
        done = self.n >= self.turns
        return TalkObservation(prompt=f"again {self.n}", turn=self.n, reward=share, done=done,
                               metadata={"success": share > 0.5} if done else {})

    @property
    def state(self) -> State:
        return State(step_count=self.n)


class TwoTexts(Action):
    code: str
    note: str = ""


class TwoTextsEnv(DigitTalk):
    """An action with two text fields: which one the reply fills must be named."""

    def step(self, action: TwoTexts, timeout_s: float | None = None, **kwargs: Any) -> TalkObservation:
        return super().step(TalkAction(message=action.code))


@contextlib.contextmanager
def serve(env: type[Environment] = DigitTalk, sessions: int = 16) -> Iterator[str]:
    """An OpenEnv server of ``env`` on a free local port, in a thread; yields its URL."""
    app = create_fastapi_app(env, TalkAction, TalkObservation, max_concurrent_envs=sessions)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the OpenEnv test server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
