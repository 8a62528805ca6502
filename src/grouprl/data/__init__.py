"""Prompt data: rows from files or ``datasets`` objects, prompt and answer columns normalised, held-out splits
(:mod:`.prompt_sets`); hub ids and folders in the hub's layout (:mod:`.hub`); chat templates (:mod:`.templates`)."""

from grouprl.data.hub import config_problem, load_hub
from grouprl.data.prompt_sets import (
    ANSWER,
    READERS,
    Row,
    check_prompt_lengths,
    check_rows,
    context_overflow,
    load_prompts,
    load_records,
    missing_file,
    normalise_prompt,
    row_places,
    train_eval_split,
)
from grouprl.errors import DataError, PromptTooLongError

__all__ = ["ANSWER", "READERS", "DataError", "PromptTooLongError", "Row", "check_prompt_lengths", "check_rows",
           "config_problem", "context_overflow", "load_hub", "load_prompts", "load_records", "missing_file",
           "normalise_prompt", "row_places", "train_eval_split"]
