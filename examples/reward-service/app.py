"""A reward service: scores completions with grouprl's math_equivalence against the rows' answer column.

    GROUPRL_REWARD_TOKEN=secret python examples/reward-service/app.py --port 8000

POST /score  {"prompts": [...], "completions": [...], "columns": {"answer": [...]}} -> {"scores": [1.0, 0.0, null]}
POST /judge  {"prompt": ..., "completions": [...], "columns": {"answer": ...}}     -> {"scores": [1.0, 0.0]} or null
"""

from __future__ import annotations

import argparse
import os
import secrets
from typing import Any

import uvicorn
from fastapi import Depends, FastAPI, Header, HTTPException
from pydantic import BaseModel

from grouprl.rewards import math_equivalence

TOKEN = os.environ.get("GROUPRL_REWARD_TOKEN")


def authorized(authorization: str | None = Header(default=None)) -> None:
    """Refuse a request without the service's bearer token (when it has one)."""
    if TOKEN and not secrets.compare_digest(authorization or "", f"Bearer {TOKEN}"):
        raise HTTPException(status_code=401, detail="missing or wrong bearer token (remote_reward_token)")


class Rows(BaseModel):
    prompts: list[Any]
    completions: list[str]
    columns: dict[str, list[Any]] = {}


class Group(BaseModel):
    prompt: Any
    completions: list[str]
    columns: dict[str, Any] = {}


app = FastAPI(title="math_equivalence reward service", dependencies=[Depends(authorized)])


def answers_of(columns: dict[str, Any], count: int) -> list[Any]:
    if "answer" not in columns:
        raise HTTPException(status_code=422, detail="the rows need an 'answer' column to score against")
    return columns["answer"] if isinstance(columns["answer"], list) else [columns["answer"]] * count


@app.post("/score")
def score(rows: Rows) -> dict[str, list[float | None]]:
    return {"scores": math_equivalence(rows.prompts, rows.completions,
                                       answer=answers_of(rows.columns, len(rows.completions)))}


@app.post("/judge")
def judge(group: Group) -> dict[str, list[float] | None]:
    g = len(group.completions)
    scores = math_equivalence([group.prompt] * g, group.completions, answer=answers_of(group.columns, g))
    return {"scores": None if None in scores else scores}  # no gold answer: the group is dropped


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
