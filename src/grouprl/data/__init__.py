"""Prompt data: rows read from files or ``datasets`` objects, the prompt column normalised, train and
held-out splits (:mod:`.loading`)."""

from grouprl.data.loading import (
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

__all__ = ["READERS", "DataError", "PromptTooLongError", "Row", "check_prompt_lengths", "check_rows",
           "context_overflow", "load_prompts", "load_records", "missing_file", "normalise_prompt", "row_places",
           "train_eval_split"]
