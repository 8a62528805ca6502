"""Assertion messages that keep what the assertion measured."""

from collections.abc import Callable


def named(label: object) -> Callable[[str], str]:
    """A ``msg`` for ``torch.testing.assert_close`` that puts ``label`` before torch's own report (how far apart,
    where, against which tolerance), which a plain string would replace."""
    return lambda report: f"{label}: {report}"
