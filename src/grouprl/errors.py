"""The errors a user can cause: each message one paragraph naming the key, file, row or function at fault,
printed by the command line without a traceback (exit status 2)."""

from __future__ import annotations

ERROR_TEXT_CHARS = 300  # of a completion, quoted in an error message


class ConfigError(ValueError):
    """Bad configuration input; the message names the key, file or argument at fault."""


class DataError(ValueError):
    """A dataset that cannot be used as given; the message names the file, row or column."""


class PromptTooLongError(DataError):
    """A prompt that leaves no room for the completion in the model's context."""


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be found or loaded; the message says what to do."""


class RewardFunctionError(RuntimeError):
    """A reward function failed on a batch; names the function, the row and its completion."""

    def __init__(self, fn_name: str, message: str, row: int | None = None, completion: str | None = None):
        self.fn_name, self.row, self.completion = fn_name, row, completion
        where = ""
        if row is not None:
            text = completion if completion is None or len(completion) <= ERROR_TEXT_CHARS else (
                completion[:ERROR_TEXT_CHARS] + "...")
            where = f" at row {row} (completion {text!r})"
        super().__init__(f"reward function {fn_name!r}{where}: {message}")


class DistributedError(RuntimeError):
    """Another process failed; the message carries its rank and error."""


class NonFiniteError(RuntimeError):
    """A NaN or infinite loss or gradient; the update was not applied, the checkpoints are intact."""


class CheckpointError(ValueError):
    """A checkpoint with a file damaged or missing; names the file and the checkpoint before it."""


class EnvError(ValueError):
    """A text environment failed every trajectory of a batch; names it, a seed it failed on and its error."""


class Interrupted(KeyboardInterrupt):
    """A signal (SIGINT, SIGTERM, ``signum``) stopped the run; what catches user code's exceptions lets it through."""

    def __init__(self, signum: int, message: str = ""):
        super().__init__(message)
        self.signum = signum
