"""What a run writes as it goes: the run folder's JSON-lines logs, each step on the console, and timing and memory
helpers (other metric sinks: :mod:`grouprl.run.loggers`)."""

from __future__ import annotations

import json
import math
import os
import resource
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from grouprl.run.files import write_text_atomic


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else value
    return value


RECORD_TEXT_CAP = 16_000
"""Characters one completions.jsonl record keeps, shared by its strings by a water level (a cut one keeps its ends)."""
KEPT_WHOLE = 64
CUT_MARK = "[... {} characters cut ...]"


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return []


def _level(lengths: list[int], budget: int) -> int:
    """The largest L with sum(min(n, L) for n in lengths) <= budget (lengths sum to more than budget)."""
    left, count = budget, len(lengths)
    for n in sorted(lengths):
        if n * count > left:
            return left // count
        left, count = left - n, count - 1
    return budget  # not reached: the lengths sum to more than the budget


def _cut(text: str, keep: int) -> str:
    if len(text) <= keep:
        return text
    head = keep - keep // 2
    return text[:head] + CUT_MARK.format(len(text) - keep) + (text[len(text) - keep // 2:] if keep // 2 else "")


def _cap_strings(value: Any, keep: int) -> Any:
    if isinstance(value, str):
        return _cut(value, keep)
    if isinstance(value, dict):
        return {k: _cap_strings(v, keep) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_cap_strings(v, keep) for v in value]
    return value


def cap_text(record: dict[str, Any], cap: int = RECORD_TEXT_CAP) -> dict[str, Any]:
    """``record`` with its string values at any depth cut to share ``cap`` characters (:data:`RECORD_TEXT_CAP`).

    >>> out = cap_text({"prompt": "What is 2+2?", "completion": "ab" * 40 + " The answer is 4."}, cap=60)
    >>> out["prompt"]  # 12 characters: under the level, kept whole
    'What is 2+2?'
    >>> out["completion"]  # 97 characters; the level 60 - 12 = 48 is under KEPT_WHOLE: 32 first + 32 last
    'abababababababababababababababab[... 33 characters cut ...]bababababababab The answer is 4.'
    """
    lengths = [len(s) for s in _strings(record)]
    if sum(lengths) <= cap:
        return record
    return _cap_strings(record, max(_level(lengths, cap), KEPT_WHOLE))


def _whole(line: bytes) -> bool:
    """Whether ``line`` (newline included) is a JSON object written to its end."""
    if not line.endswith(b"\n"):
        return False
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:  # JSONDecodeError, or bytes that are not UTF-8
        return False


class JsonlLog:
    """An append-only JSON-lines file: each :meth:`append` writes and fsyncs at once, so a kill tears only the last
    append, which opening the log cuts off. ``text_cap``: see :func:`cap_text`."""

    def __init__(self, path: Path, text_cap: int | None = None):
        self.path = Path(path)
        self.text_cap = text_cap
        for stale in self.path.parent.glob(f".{self.path.name}.*.tmp"):  # a rewrite a kill interrupted
            stale.unlink(missing_ok=True)
        if self.path.exists():
            self._drop_torn_end()

    def _drop_torn_end(self) -> None:
        data = self.path.read_bytes()
        end = len(data)
        while end:  # walk back over the lines at the end that are not whole
            start = data.rfind(b"\n", 0, end - 1) + 1
            line = data[start:end]
            if _whole(line) or not line.strip():
                break
            if _whole(line + b"\n"):  # a whole record whose newline the kill kept from the disk
                with open(self.path, "ab") as f:
                    f.write(b"\n")
                return
            end = start
        if end < len(data):
            os.truncate(self.path, end)

    def append(self, records: list[dict[str, Any]] | dict[str, Any]) -> None:
        records = [records] if isinstance(records, dict) else records
        if not records:
            return
        plain = [{k: _plain(v) for k, v in r.items()} for r in records]
        if self.text_cap is not None:
            plain = [cap_text(r, self.text_cap) for r in plain]
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in plain)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    def _lines(self) -> list[str]:
        if not self.path.exists():
            return []
        # "\n" only: str.splitlines also splits at U+2028 and the like, which ensure_ascii=False leaves in
        return [line for line in self.path.read_text(encoding="utf-8", errors="replace").split("\n") if line]

    def truncate_after(self, step: int) -> None:
        kept = []
        for line in self._lines():
            try:
                if json.loads(line).get("step", 0) <= step:
                    kept.append(line + "\n")
            except (ValueError, AttributeError):
                continue  # a line torn by a crash
        write_text_atomic(self.path, "".join(kept))

    def records(self) -> list[dict[str, Any]]:
        out = []
        for line in self._lines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                out.append(record)
        return out


class NullLog:
    def append(self, records: Any) -> None:
        pass

    def truncate_after(self, step: int) -> None:
        pass

    def records(self) -> list[dict[str, Any]]:
        return []


SHOWN_WHEN_PRESENT = (("env/success", "success", "{:.2f}"), ("env/turns_mean", "turns", "{:.1f}"))


class Progress:
    """Each step on the console: a live rich bar on a terminal, one plain line per step otherwise."""

    def __init__(self, total: int, start: int, enabled: bool, label: str = "grpo",
                 rate: tuple[str, str] = ("throughput/tokens_per_s", "tok/s"), console: Any = None):
        self.bar = self.console = None
        self.total, self.label, self.rate_key, self.rate_unit = total, label, rate[0], rate[1]
        if not enabled:
            return
        from rich.console import Console

        self.console = console if console is not None else Console()
        if not (self.console.is_terminal or self.console.is_jupyter):
            return  # plain lines
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
        from rich.progress import Progress as RichProgress

        self.bar = RichProgress(
            TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(),
            TextColumn(f"reward {{task.fields[reward]}}  kl {{task.fields[kl]}}  {{task.fields[tps]}} {rate[1]}"
                       "{task.fields[extra]}"),
            TimeElapsedColumn(), TimeRemainingColumn(), console=self.console,
        )
        self.task = self.bar.add_task("train", total=total, completed=start, reward="-", kl="-", tps="-", extra="")
        self.bar.start()

    def update(self, step: int, metrics: dict[str, Any], alert: str | None = None) -> None:
        if self.console is None:
            return
        kl = metrics.get("policy/kl")
        reward = f"{_plain(metrics.get('reward/mean', 0.0)):.3f}"
        kl = "-" if kl is None else f"{_plain(kl):.4f}"
        rate = f"{_plain(metrics.get(self.rate_key, 0.0)):.0f}"
        extra = "".join(f"  {label} {fmt.format(_plain(metrics[key]))}" for key, label, fmt in SHOWN_WHEN_PRESENT
                        if metrics.get(key) is not None)
        if self.bar is None:
            seconds = metrics.get("time/step")
            per_step = "" if seconds is None else f"  {_plain(seconds):.2f} s/step"
            print(f"{self.label} step {step}/{self.total}  reward {reward}  kl {kl}{per_step}  {rate} {self.rate_unit}"
                  f"{extra}{f'  ! {alert}' if alert else ''}", file=self.console.file, flush=True)
            return
        if alert:
            extra += f"  [yellow]! {alert}[/yellow]"
        self.bar.update(self.task, completed=step, reward=reward, kl=kl, tps=rate, extra=extra)

    def print(self, *args: Any) -> None:
        if self.console is not None:
            self.console.print(*args, soft_wrap=True)

    def sample(self, step: int, reward: float | None, text: str) -> None:
        """Show a completion's first 200 characters, escaped: model text may hold rich's closing tags."""
        if self.console is not None:
            from rich.markup import escape

            score = "-" if reward is None else f"{reward:.3f}"
            self.console.print(f"[dim]step {step} reward {score}[/dim] {escape(repr(text[:200]))}", soft_wrap=True,
                               highlight=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


class PhaseTimer:
    """Wall time per named phase (``with timer("rollout"): ...``); ``spans``: each one's first start, last end."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.spans: dict[str, tuple[float, float]] = {}

    @contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            self.seconds[phase] = self.seconds.get(phase, 0.0) + end - start
            self.spans[phase] = (self.spans.get(phase, (start, end))[0], end)

    def metrics(self) -> dict[str, float]:
        return {f"time/{k}": v for k, v in self.seconds.items()}


def peak_rss_mb() -> float:
    """Peak resident memory in MiB: Linux's ``VmHWM``, since ``ru_maxrss`` survives ``execve`` (a parent's peak)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


TENSOR_KINDS = ("PREEXISTING", "PARAMETER", "OPTIMIZER_STATE", "INPUT", "TEMPORARY", "ACTIVATION", "GRADIENT",
                "AUTOGRAD_DETAIL", "UNKNOWN")  # the columns of PyTorch's memory timeline


def peak_tensor_bytes(fn: Any) -> tuple[int, dict[str, int]]:
    """Peak bytes of CPU tensors while ``fn()`` runs, and that moment's bytes by kind; activations count as such only
    when ``fn`` runs a backward pass."""
    import tempfile
    import warnings

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the timeline export is marked for a future removal
        path = Path(folder) / "timeline.json"
        prof.export_memory_timeline(str(path), device="cpu")
        _, sizes = json.loads(path.read_text())
    totals = [sum(s) for s in sizes]
    at = max(range(len(totals)), key=totals.__getitem__)
    return totals[at], dict(zip(TENSOR_KINDS, sizes[at]))
