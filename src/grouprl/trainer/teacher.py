"""On-policy distillation's teacher (:mod:`grouprl.algos.distillation`): the log-prob it gives each sampled token,
at temperature 1 (its own distribution), from a model in this process or from a ``grouprl serve`` server of it
(``teacher_model: http://host:port``: vLLM's prompt log-probs of prompt + completion, one request a row)."""

from __future__ import annotations

import concurrent.futures
import os
import time
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from grouprl.serve.client.server_sampler import GENERATE
from grouprl.types import RolloutBatch

if TYPE_CHECKING:
    from grouprl.trainer.config import TrainerConfig
    from grouprl.trainer.policy import PolicyPasses

IN_FLIGHT = 8  # rows a server teacher scores at once
PROBE = "Teacher, 12 + 30 = 42? Ünïcode ✓ <think>def f(x):\n\treturn x ** 2</think>"


def is_server(spec: str | None) -> bool:
    return bool(spec) and spec.startswith(("http://", "https://"))


def teacher_problems(c: TrainerConfig) -> list[str]:
    """What contradicts in the distillation keys (nothing is loaded)."""
    from grouprl.trainer.algorithms import ALGORITHMS

    if c.distill_coef < 0 or c.distill_coef != c.distill_coef:
        return [f"distill_coef={c.distill_coef} must be >= 0"]
    if c.distill_coef > 0 and not c.teacher_model:
        return ["distill_coef > 0 distills from teacher_model: set it (a model as `model` takes, or the "
                "http://host:port of a grouprl serve server of it)"]
    if c.teacher_model and c.distill_coef == 0:
        return [f"teacher_model={c.teacher_model!r} is read only with distill_coef > 0 (1: distil alone, or added "
                "to the task's advantages)"]
    algo = ALGORITHMS.get(c.algo) if c.algo in ALGORITHMS else None
    if c.distill_coef > 0 and algo is not None and (algo.critic or algo.update != "clipped"):
        return [f"distill_coef: on-policy distillation adds per-token advantages to grpo, rloo or reinforce; "
                f"algo={c.algo} is not one of them"]
    return []


def tokenizer_problem(policy_tokenizer: Any, teacher_tokenizer: Any, name: str) -> str | None:
    """Why ``teacher_tokenizer`` cannot score the policy's token ids (None when both map every token alike)."""
    mine, theirs = policy_tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
    if mine == theirs:
        return None
    differ = sorted(t for t in set(mine) | set(theirs) if mine.get(t) != theirs.get(t))
    example = differ[0]
    return (f"teacher_model {name!r} has another tokenizer than the policy ({len(theirs)} tokens against "
            f"{len(mine)}; {example!r} is id {theirs.get(example)} there, {mine.get(example)} here): distillation "
            f"scores the policy's token ids under the teacher, so the two must share one tokenizer")


class ModelTeacher:
    """A frozen teacher model in this process."""

    def __init__(self, model: nn.Module, passes: PolicyPasses):
        self.model, self.passes = model.eval().requires_grad_(False), passes

    def logprobs(self, batch: RolloutBatch, only: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, T]`` the teacher's log-probs of the completions' tokens (0 in the rows ``only [B]`` leaves out)."""
        return self.passes.logprobs(self.model, batch, only=only, temperature=1.0)

    def close(self) -> None:
        self.model = None  # its memory goes with the last reference


class ServerTeacher:
    """A teacher on a ``grouprl serve`` server: each row's prompt and completion sent as one prompt, whose
    log-probs vLLM returns (``prompt_logprobs: 0``: the given tokens' own)."""

    def __init__(self, address: str, token: str, timeout: float, tokenizer: Any):
        import httpx

        self.address = address.rstrip("/")
        self.client = httpx.Client(base_url=self.address, timeout=timeout,
                                   headers={"Authorization": f"Bearer {token}"} if token else {})
        self.wait_ready(timeout)
        self.check_tokenizer(tokenizer)

    def wait_ready(self, timeout: float) -> None:
        """Until the server answers (it may still be loading), at most ``timeout`` s; a refused token at once."""
        import httpx

        deadline = time.monotonic() + timeout
        while True:
            try:
                answer = self.client.get("/grouprl/info")
            except httpx.TransportError as e:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"teacher server {self.address} did not answer within {timeout:.0f} s: "
                                       f"{type(e).__name__} {e}") from e
                time.sleep(1.0)
                continue
            if answer.status_code == 401:
                raise RuntimeError(f"teacher server {self.address} refused the token (rollout_server_token, "
                                   f"GROUPRL_SERVER_TOKEN): {answer.text[:200]}")
            answer.raise_for_status()
            return

    def check_tokenizer(self, tokenizer: Any) -> None:
        """The server's tokenizer must cut a probe text as the policy's does: it scores the policy's token ids."""
        answer = self.client.post("/tokenize", json={"prompt": PROBE, "add_special_tokens": False})
        answer.raise_for_status()
        theirs, mine = answer.json().get("tokens"), tokenizer(PROBE, add_special_tokens=False)["input_ids"]
        if theirs != mine:
            raise ValueError(f"teacher_model {self.address}: its tokenizer cuts {PROBE!r} into {theirs}, the "
                             f"policy's into {mine}; distillation scores the policy's token ids under the teacher, "
                             f"so the two must share one tokenizer")

    def logprobs(self, batch: RolloutBatch, only: torch.Tensor | None = None) -> torch.Tensor:
        out = torch.zeros(batch.completion_ids.shape, dtype=torch.float32)
        rows = [i for i in range(batch.batch_size) if only is None or bool(only[i])]
        with concurrent.futures.ThreadPoolExecutor(IN_FLIGHT) as pool:
            for i, got in zip(rows, pool.map(lambda i: self._row(batch, i), rows)):
                out[i, :len(got)] = torch.tensor(got)
        return out.to(batch.completion_ids.device)

    def _row(self, batch: RolloutBatch, i: int) -> list[float]:
        prompt = batch.prompt_ids[i][batch.prompt_mask[i] > 0].tolist()
        n = int(batch.completion_mask[i].nonzero().max()) + 1 if batch.completion_mask[i].any() else 0
        if n == 0:
            return []
        ids = prompt + batch.completion_ids[i, :n].tolist()
        answer = self.client.post(GENERATE, json={"token_ids": ids, "sampling_params": {
            "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0, "detokenize": False}})
        if answer.status_code != 200:
            raise RuntimeError(f"teacher server {self.address} answered {answer.status_code}: {answer.text[:300]}")
        scored = answer.json().get("prompt_logprobs") or []
        if len(scored) != len(ids):
            raise RuntimeError(f"teacher server {self.address} scored {len(scored)} of {len(ids)} tokens")
        return [float(scored[j][str(t)]["logprob"]) for j, t in enumerate(ids) if j >= len(prompt)]

    def close(self) -> None:
        self.client.close()


def server_token(c: TrainerConfig, address: str) -> str:
    """The teacher server's token: rollout_server_token, the servers' environment variable, or what a server on
    this machine wrote for its port."""
    from urllib.parse import urlsplit

    from grouprl.serve.server.guard import TOKEN_ENV, token_file

    given = c.rollout_server_token or os.environ.get(TOKEN_ENV)
    if given:
        return given
    port = urlsplit(address).port
    path = token_file(port) if port else None
    return path.read_text().strip() if path is not None and path.is_file() else ""


def make_teacher(c: TrainerConfig, passes: PolicyPasses, tokenizer: Any, teacher: nn.Module | None,
                 teacher_tokenizer: Any, device: torch.device | None) -> ModelTeacher | ServerTeacher | None:
    """The run's teacher: ``teacher`` (a model the caller loaded, with its tokenizer), else ``teacher_model`` loaded
    here, held in the training format (bf16 training: a bf16 teacher, half the memory; its forward computes in bf16
    under autocast either way), or reached on its server; None without distillation."""
    if not c.distill_coef:
        return None
    if teacher is None and is_server(c.teacher_model):
        return ServerTeacher(c.teacher_model, server_token(c, c.teacher_model), c.rollout_server_timeout,
                             tokenizer)
    if teacher is None:
        from grouprl.models import load_policy

        teacher, teacher_tokenizer = load_policy(c.teacher_model, dtype=torch.bfloat16 if c.train_bf16 else None)
    if teacher_tokenizer is not None:
        problem = tokenizer_problem(tokenizer, teacher_tokenizer, c.teacher_model or type(teacher).__name__)
        if problem:
            raise ValueError(problem)
    if c.train_bf16:
        teacher = teacher.to(torch.bfloat16)
    return ModelTeacher(teacher if device is None else teacher.to(device), passes)
