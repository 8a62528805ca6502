"""Learned reward models: a one-output sequence classifier reading the chat-rendered conversation, trained on
preference pairs with the Bradley-Terry loss ``-log sigmoid(r_chosen - r_rejected)`` (Ouyang et al. 2022, eq. 1)."""

from __future__ import annotations

import inspect
import json
import os
import random
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from grouprl.data import load_records
from grouprl.data.prompt_sets import normalise_prompt
from grouprl.data.templates import Rendered, render, text_ids
from grouprl.errors import ConfigError, DataError
from grouprl.types import to_messages

PAIR_COLUMNS = ("prompt", "chosen", "rejected")


def _conversation(tokenizer: Any, prompt: Any, completion: str, system_prompt: str | None) -> Rendered | str:
    if getattr(tokenizer, "chat_template", None) is None:
        if not isinstance(prompt, str):
            raise ValueError("the prompt is chat messages but the reward model's tokenizer has no chat template")
        return (f"{system_prompt}\n\n" if system_prompt else "") + prompt + completion
    messages = [*to_messages(prompt, system_prompt), {"role": "assistant", "content": completion}]
    return render(tokenizer, messages, add_generation_prompt=False)


def render_conversation(tokenizer: Any, prompt: Any, completion: str, system_prompt: str | None = None) -> str:
    """The text a reward model reads: (system prompt,) prompt and the completion as the assistant's reply,
    through the chat template, else concatenated."""
    rendered = _conversation(tokenizer, prompt, completion, system_prompt)
    return rendered if isinstance(rendered, str) else rendered.text


def conversation_ids(tokenizer: Any, prompt: Any, completion: str, system_prompt: str | None = None) -> list[int]:
    """Token ids of :func:`render_conversation`'s text: the prompt's and the completion's text as text (a
    special-token string a completion writes is not a turn marker), only the template's markers special."""
    rendered = _conversation(tokenizer, prompt, completion, system_prompt)
    return text_ids(tokenizer, rendered) if isinstance(rendered, str) else rendered.ids(tokenizer)


def _left_padded(tokenizer: Any, rows: list[list[int]], max_length: int | None) -> dict[str, torch.Tensor]:
    """Ids, attention mask and position ids ``[N, L]`` of ``rows`` left-padded, positions from 0 at each row's
    first token (a row scores the same alone or padded); a row over ``max_length`` keeps its last tokens."""
    ids = rows if max_length is None else [x[-max_length:] for x in rows]
    width = max(len(x) for x in ids)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], dtype=torch.long)
    return {"input_ids": input_ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


def _forward_scores(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """[N] float32 scores; position ids are passed only to models whose forward takes them."""
    accepted = inspect.signature(model.forward).parameters
    device = next(model.parameters()).device
    inputs = {k: v.to(device) for k, v in batch.items() if k != "position_ids" or k in accepted}
    return model(**inputs).logits[:, 0].float()


def _prepare(model: torch.nn.Module, tokenizer: Any) -> None:
    if getattr(model.config, "num_labels", 1) != 1:
        raise ValueError(f"a reward model has one output (num_labels=1), this one has {model.config.num_labels}")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
        warnings.warn(f"the reward model's tokenizer has no pad token; using {tokenizer.eos_token!r}", stacklevel=3)
    model.config.pad_token_id = tokenizer.pad_token_id


def _load(path_or_model: str | Path | torch.nn.Module, tokenizer: Any) -> tuple[torch.nn.Module, Any]:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if isinstance(path_or_model, torch.nn.Module):
        if tokenizer is None:
            raise ValueError("pass the tokenizer along with a reward model object")
        return path_or_model, tokenizer
    path = Path(path_or_model).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"reward model folder {str(path)!r} does not exist")
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
    return model, tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(path)


class RewardModel:
    """A reward function backed by a sequence-classification model: ``RewardModel("runs/rm")`` loads one,
    ``RewardModel(model, tokenizer)`` wraps one; ``rm(prompts, completions)`` -> B floats."""

    def __init__(self, path_or_model: str | Path | torch.nn.Module, tokenizer: Any = None, batch_size: int = 8,
                 system_prompt: str | None = None, max_length: int | None = None, name: str = "reward_model"):
        self.model, self.tokenizer = _load(path_or_model, tokenizer)
        _prepare(self.model, self.tokenizer)
        self.model.eval().requires_grad_(False)
        self.batch_size, self.system_prompt, self.max_length, self.name = batch_size, system_prompt, max_length, name

    def score_ids(self, rows: list[list[int]]) -> list[float]:
        """Scores of conversations given as token ids."""
        scores: list[float] = []
        for start in range(0, len(rows), self.batch_size):
            batch = _left_padded(self.tokenizer, rows[start:start + self.batch_size], self.max_length)
            with torch.no_grad():
                scores += _forward_scores(self.model, batch).tolist()
        return scores

    def __call__(self, prompts: list[Any], completions: list[str], **_: Any) -> list[float]:
        return self.score_ids([conversation_ids(self.tokenizer, p, c, self.system_prompt)
                               for p, c in zip(prompts, completions)])


@dataclass
class RewardTrainResult:
    """What :func:`train_reward_model` did: the last epoch's mean losses and held-out accuracy (share of pairs
    with r(chosen) > r(rejected), ties wrong), and one ``history`` entry per epoch."""

    model: torch.nn.Module
    train_loss: float
    eval_accuracy: float | None
    eval_loss: float | None
    output_dir: Path | None
    history: list[dict[str, float]] = field(default_factory=list)


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Mean of -log sigmoid(r_chosen - r_rejected) over pairs; chosen, rejected: [N].

    >>> round(bradley_terry_loss(torch.tensor([0.0, 2.0]), torch.tensor([0.0, 0.0])).item(), 4)  # (0.6931+0.1269)/2
    0.41
    """
    return -F.logsigmoid(chosen - rejected).mean()


def load_pairs(source: str | Path | Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Preference pairs (JSONL or any :func:`grouprl.data.load_records` source) with ``prompt``,
    ``chosen`` and ``rejected``; a row lacking one is an error naming the row and its columns."""
    rows = load_records(list(source) if isinstance(source, Sequence) and not isinstance(source, str) else source)
    if not rows:
        raise ValueError(f"no preference pairs in {source if isinstance(source, str | Path) else 'the list'}")
    for i, row in enumerate(rows):
        missing = [c for c in PAIR_COLUMNS if c not in row]
        if missing:
            raise ValueError(f"preference pair {i} lacks {missing}; it has columns {list(row)}")
        for key in ("chosen", "rejected"):
            if not isinstance(row[key], str):
                raise DataError(f"preference pair {i}: {key!r} must be text, got {type(row[key]).__name__} "
                                f"{row[key]!r:.80}")
        normalise_prompt(row["prompt"], i)
    if all(r["chosen"] == r["rejected"] for r in rows):
        warnings.warn(f"every one of the {len(rows)} preference pairs has chosen == rejected: a reward model can "
                      "learn nothing from them", stacklevel=2)
    return rows


def _pair_scores(model: torch.nn.Module, tokenizer: Any, pairs: list[dict[str, Any]], system_prompt: str | None,
                 max_length: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores [N] of chosen and of rejected completions, in one forward pass of 2N rows."""
    rows = [conversation_ids(tokenizer, p["prompt"], p[key], system_prompt)
            for key in ("chosen", "rejected") for p in pairs]
    scores = _forward_scores(model, _left_padded(tokenizer, rows, max_length))  # [2N]
    return scores[:len(pairs)], scores[len(pairs):]


def evaluate_pairs(model: torch.nn.Module, tokenizer: Any, pairs: list[dict[str, Any]], batch_size: int = 16,
                   system_prompt: str | None = None, max_length: int | None = None) -> tuple[float, float]:
    """(accuracy, mean Bradley-Terry loss) on ``pairs``."""
    was_training = model.training
    model.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for start in range(0, len(pairs), batch_size):
            chunk = pairs[start:start + batch_size]
            chosen, rejected = _pair_scores(model, tokenizer, chunk, system_prompt, max_length)
            correct += int((chosen > rejected).sum())
            loss += bradley_terry_loss(chosen, rejected).item() * len(chunk)
    model.train(was_training)
    return correct / len(pairs), loss / len(pairs)


SAVED_MARKER = "grouprl-saved.json"
"""The files :func:`save_pretrained_atomic` wrote into a folder: a later save replaces only those."""


def check_replaceable(path: str | Path) -> None:
    """Refuse ``path`` when it holds anything a grouprl save did not write (a run, a user's files)."""
    folder = Path(path)
    if not folder.exists() or (folder.is_dir() and not any(folder.iterdir())):
        return
    if not folder.is_dir():
        raise ConfigError(f"output_dir {str(folder)!r} is a file; choose a folder")
    try:
        written = set(json.loads((folder / SAVED_MARKER).read_text())["files"])
    except (OSError, ValueError, KeyError, TypeError):
        written = None
    foreign = sorted(p.name for p in folder.iterdir() if written is None or (p.name not in written
                                                                             and p.name != SAVED_MARKER))
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ConfigError(f"output_dir {str(folder)!r} holds files this command did not write ({shown}); saving "
                          "would delete them. Choose another --output_dir")


def save_pretrained_atomic(model: torch.nn.Module, tokenizer: Any, path: str | Path, overwrite: bool = True) -> Path:
    """``save_pretrained`` model + tokenizer into a temporary sibling, then rename it into place, so a crash
    never leaves a half-written ``path``; only a folder an earlier save wrote is replaced."""
    final = Path(path)
    if final.exists() and not overwrite:
        raise FileExistsError(f"{final} exists; pass overwrite=True to replace it")
    check_replaceable(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.tmp-"))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        files = sorted(p.name for p in tmp.iterdir())
        (tmp / SAVED_MARKER).write_text(json.dumps({"files": files}, indent=1))
        if final.exists():
            old = final.with_name(f".{final.name}.old-{os.getpid()}")
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def train_reward_model(model: str | Path | torch.nn.Module, tokenizer: Any, pairs: str | Path | Sequence[dict],
                       *, output_dir: str | Path | None = None, eval_pairs: str | Path | Sequence[dict] | None = None,
                       eval_fraction: float = 0.1, epochs: int = 1, batch_size: int = 8, lr: float = 1e-5,
                       weight_decay: float = 0.0, seed: int = 0, system_prompt: str | None = None,
                       max_length: int | None = None) -> RewardTrainResult:
    """Fit a reward model (a causal LM's folder gets a random head) to ``pairs`` with the Bradley-Terry loss;
    ``eval_pairs`` None holds out ``eval_fraction`` of ``pairs``."""
    train = load_pairs(pairs)
    if eval_pairs is not None:
        held = load_pairs(eval_pairs)
    elif eval_fraction > 0:
        order = list(range(len(train)))
        random.Random(seed).shuffle(order)
        n_eval = max(1, round(eval_fraction * len(train)))
        held, train = [train[i] for i in order[:n_eval]], [train[i] for i in order[n_eval:]]
    else:
        held = []
    if not train:
        raise ValueError(f"{len(held)} preference pair(s) in all, and eval_fraction={eval_fraction} holds them out: "
                         "add pairs, or set eval_fraction 0 (or give eval_pairs)")
    model, tokenizer = _load(model, tokenizer)
    _prepare(model, tokenizer)
    model.requires_grad_(True)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr,
                                  weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)
    history: list[dict[str, float]] = []
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(len(train), generator=generator).tolist()
        total = 0.0
        for start in range(0, len(order), batch_size):
            chunk = [train[i] for i in order[start:start + batch_size]]
            chosen, rejected = _pair_scores(model, tokenizer, chunk, system_prompt, max_length)
            loss = bradley_terry_loss(chosen, rejected)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(chunk)
        entry = {"epoch": epoch + 1, "train_loss": total / len(train)}
        if held:
            entry["eval_accuracy"], entry["eval_loss"] = evaluate_pairs(model, tokenizer, held, batch_size,
                                                                        system_prompt, max_length)
        history.append(entry)
    model.eval()
    saved = save_pretrained_atomic(model, tokenizer, output_dir) if output_dir is not None else None
    last = history[-1] if history else {}
    return RewardTrainResult(model=model, train_loss=last.get("train_loss", float("nan")),
                             eval_accuracy=last.get("eval_accuracy"), eval_loss=last.get("eval_loss"),
                             output_dir=saved, history=history)
