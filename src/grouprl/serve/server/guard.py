"""Who may use a rollout server and how much one request may ask: an ASGI middleware outermost around the whole app,
so nothing reaches vLLM that it refused. Whoever reaches the port could otherwise replace the policy.

- A bearer token on every route but ``GET /health`` (constant-time compare; a 401 never echoes what was sent).
  vLLM's own ``--api-key`` guards neither ``/grouprl`` nor ``/tokenize`` nor ``/metrics``, and puts the token in
  the process's command line.
- A body over ``max_body_bytes`` is a 413, read no further.
- Generation: at most ``max_rows`` rows a request and ``max_tokens`` at most ``max_model_len`` (else a 400); a
  server whose weights could not be restored (``ServerState.broken``) answers 503 rather than sample them.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

TOKEN_ENV = "GROUPRL_SERVER_TOKEN"
OPEN_PATHS = frozenset({"/health"})  # answered without a token, to GET or HEAD: a supervisor's liveness check
GENERATION_PATHS = frozenset({"/inference/v1/generate", "/v1/completions", "/v1/chat/completions", "/v1/responses",
                              "/v1/messages"})
DEFAULT_MAX_BODY_MIB = 16
DRAIN_FACTOR = 4  # a refused request's unread body is dropped up to this many body caps, then the connection closed
MAKE_ONE = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


class Refusal(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def token_file(port: int) -> Path:
    """Where a server on ``port`` writes the token it made: ``XDG_RUNTIME_DIR``, else ``~/.cache/grouprl``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "grouprl" if runtime and Path(runtime).is_dir() else Path.home() / ".cache" / "grouprl"
    return base / f"server-{port}.token"


def server_token(given: str | None, host: str, port: int, echo: Callable[[str], None] = print) -> str:
    """``given``, else ``GROUPRL_SERVER_TOKEN``, else on a loopback address a new one written to :func:`token_file`
    (mode 0600; its path said, never the token); elsewhere none is an error."""
    token = given or os.environ.get(TOKEN_ENV) or None
    if token is not None:
        if len(token) < 16:
            raise ValueError(f"the server token must be at least 16 characters (got {len(token)}): make one with "
                             f"{MAKE_ONE}")
        return token
    if not is_loopback(host):
        raise ValueError(f"grouprl serve --host {host} listens beyond this machine and needs a token: set "
                         f"{TOKEN_ENV} (e.g. export {TOKEN_ENV}=$({MAKE_ONE})) or pass --api_key, and give trainers "
                         f"the same token (rollout_server_token or {TOKEN_ENV})")
    token, path = secrets.token_urlsafe(32), token_file(port)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "w") as f:
        os.fchmod(fd, 0o600)  # a file that existed keeps its mode through O_CREAT
        f.write(token + "\n")
    echo(f"grouprl serve: no token given; made one, in {path} (readable by this user only): give it to trainers as "
         f"{TOKEN_ENV} or rollout_server_token")
    return token


def authorised(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header value carries ``token`` as a bearer token."""
    scheme, _, given = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def generation_problem(path: str, body: Any, max_rows: int, max_model_len: int) -> str | None:
    """What is over this server's limits in a generation request's JSON ``body``; ill-typed fields are vLLM's to
    refuse."""
    if not isinstance(body, dict):
        return None
    params = body.get("sampling_params") if isinstance(body.get("sampling_params"), dict) else body
    n = _int(params.get("n")) or 1
    prompts: Any = 1  # a prompt is a string or a list of ids; a list of those is many
    if path.endswith(("/generate", "/v1/completions")):
        prompts = body.get("token_ids", body.get("prompt"))
        one = isinstance(prompts, str) or (isinstance(prompts, list) and all(isinstance(v, int) for v in prompts))
        prompts = 1 if one else len(prompts) if isinstance(prompts, list) else None
    if prompts is not None and prompts * n > max_rows:
        return (f"{prompts} prompt(s) x n={n} = {prompts * n} rows in one request; this server takes at most "
                f"{max_rows} (its --max_rows): split the request")
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        wanted = _int(params.get(key))
        if wanted is not None and wanted > max_model_len:
            return f"{key}={wanted} is over this server's max_model_len of {max_model_len} tokens"
    return None


class Guard:
    """The middleware around ``app``; ``state`` is the server's :class:`~.routes.ServerState`."""

    def __init__(self, app: Any, token: str, state: Any, max_rows: int,
                 max_body_bytes: int = DEFAULT_MAX_BODY_MIB << 20):
        if not token:
            raise ValueError("a rollout server's guard needs a token")
        self.app, self.token, self.state = app, token, state
        self.max_rows, self.max_body_bytes = max_rows, max_body_bytes

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path = scope.get("path", "").removeprefix(scope.get("root_path", ""))
        method = scope.get("method", "GET")
        read = False  # whether the request's body has been read to its end
        try:
            if path in OPEN_PATHS and method in ("GET", "HEAD"):
                return await self.app(scope, receive, send)
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            if not authorised(headers.get("authorization"), self.token):
                said = "a wrong bearer token" if "authorization" in headers else "no Authorization header"
                raise Refusal(401, f"this server needs 'Authorization: Bearer <token>' on every route but /health; "
                                   f"the request had {said} (trainers: rollout_server_token or {TOKEN_ENV})")
            if scope["type"] == "websocket":
                return await self.app(scope, receive, send)
            declared = headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self.max_body_bytes:
                raise Refusal(413, self._too_large(int(declared)))
            if method not in ("POST", "PUT", "PATCH"):
                return await self.app(scope, receive, send)
            body = await self._read(receive)
            read = True
            if path in GENERATION_PATHS:
                self._check_generation(path, body)
        except Refusal as refusal:
            return await self._refuse(scope, send, refusal, None if read else receive)
        return await self.app(scope, _replay(body, receive), send)

    def _too_large(self, size: int) -> str:
        return f"the request body is {size} bytes or more; this server takes at most {self.max_body_bytes}"

    async def _read(self, receive: Receive) -> bytes:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise Refusal(400, "the client went away before its request body ended")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise Refusal(413, self._too_large(size))
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _check_generation(self, path: str, body: bytes) -> None:
        if broken := self.state.broken:
            raise Refusal(503, f"this server cannot generate: {broken}; push a complete weights folder to recover")
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            return  # vLLM answers a body that is not JSON with its own 400
        problem = generation_problem(path, parsed, self.max_rows, int(self.state.max_model_len))
        if problem:
            raise Refusal(400, problem)

    async def _refuse(self, scope: dict[str, Any], send: Send, refusal: Refusal, unread: Receive | None) -> None:
        """Answer ``refusal`` after dropping an ``unread`` body (up to :data:`DRAIN_FACTOR` caps): a connection closed
        on unread data is reset and the client may lose the answer."""
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": refusal.message[:120]})
            return
        drained = 0
        while unread is not None and drained <= DRAIN_FACTOR * self.max_body_bytes:
            message = await unread()
            drained += len(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        payload = json.dumps({"error": refusal.message, "detail": refusal.message}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                   (b"connection", b"close")]
        if refusal.status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the body already read, then the connection's next message."""
    first = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> dict[str, Any]:
        return first.pop() if first else await receive()

    return replay
