"""Where metrics go: a JSONL file in the run folder (always), TensorBoard (when installed), and a
live terminal progress bar; plus the sample-completions log and small timing/memory helpers."""

from __future__ import annotations

import json
import math
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


class JsonlLog:
    """An append-only JSON-lines log that is rewritten atomically on every append.

    Runs log a few thousand lines at most, so rewriting the file keeps it whole across a kill at
    negligible cost. Opening an existing log (on resume) keeps its lines; ``truncate_after(step)``
    drops lines logged after the checkpoint being resumed, so the resumed run does not repeat them.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.lines: list[str] = []
        for stale in self.path.parent.glob(f".{self.path.name}.*.tmp"):  # a rewrite a kill interrupted
            stale.unlink(missing_ok=True)
        if self.path.exists():
            # split at "\n" only: str.splitlines also splits at U+2028, U+0085 and the like, which a sampled
            # completion may hold and json.dumps(ensure_ascii=False) leaves as they are
            for line in self.path.read_text(encoding="utf-8").split("\n"):
                if not line:
                    continue
                try:
                    json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line torn by a crash of an older writer
                self.lines.append(line)

    def append(self, records: list[dict[str, Any]] | dict[str, Any]) -> None:
        records = [records] if isinstance(records, dict) else records
        self.lines.extend(json.dumps({k: _plain(v) for k, v in r.items()}, ensure_ascii=False) for r in records)
        write_text_atomic(self.path, "".join(line + "\n" for line in self.lines))

    def truncate_after(self, step: int) -> None:
        self.lines = [line for line in self.lines if json.loads(line).get("step", 0) <= step]
        write_text_atomic(self.path, "".join(line + "\n" for line in self.lines))

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines]


class NullLog:
    """The metrics and completions logs of every process of a run but the first: nothing is written."""

    def append(self, records: Any) -> None:
        pass

    def truncate_after(self, step: int) -> None:
        pass

    def records(self) -> list[dict[str, Any]]:
        return []


class TensorBoardSink:
    """Scalars to TensorBoard event files; a no-op object when tensorboard is not installed."""

    def __init__(self, log_dir: Path, enabled: bool):
        self.writer = None
        if not enabled:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is an optional extra
            return
        self.writer = SummaryWriter(str(log_dir))

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if self.writer is None:
            return
        for k, v in metrics.items():
            v = _plain(v)
            if isinstance(v, int | float) and not isinstance(v, bool):
                self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


SHOWN_WHEN_PRESENT = (("env/success", "success", "{:.2f}"), ("env/turns_mean", "turns", "{:.1f}"))
"""Metrics the bar shows only for runs that have them (an agent's success rate and turns)."""


class Progress:
    """A rich progress bar: step, reward, KL, a rate (tokens/s by default), and an agent's success
    rate and turns when the run has them. Silent when disabled.

    ``label`` names the run on the bar; ``rate`` is (metric key, unit) of the rate shown, so a
    classic-control run shows environment steps per second instead of tokens."""

    def __init__(self, total: int, start: int, enabled: bool, label: str = "grpo",
                 rate: tuple[str, str] = ("throughput/tokens_per_s", "tok/s")):
        self.bar = None
        self.rate_key = rate[0]
        if not enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
        from rich.progress import Progress as RichProgress

        self.bar = RichProgress(
            TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(),
            TextColumn(f"reward {{task.fields[reward]}}  kl {{task.fields[kl]}}  {{task.fields[tps]}} {rate[1]}"
                       "{task.fields[extra]}"),
            TimeElapsedColumn(), TimeRemainingColumn(),
        )
        self.task = self.bar.add_task("train", total=total, completed=start, reward="-", kl="-", tps="-", extra="")
        self.bar.start()

    def update(self, step: int, metrics: dict[str, Any], alert: str | None = None) -> None:
        """Show ``step``'s metrics, and ``alert`` (a short warning from :mod:`grouprl.run.health`) if any."""
        if self.bar is None:
            return
        kl = metrics.get("policy/kl")
        extra = "".join(f"  {label} {fmt.format(_plain(metrics[key]))}" for key, label, fmt in SHOWN_WHEN_PRESENT
                        if metrics.get(key) is not None)
        if alert:
            extra += f"  [yellow]! {alert}[/yellow]"
        self.bar.update(self.task, completed=step, reward=f"{_plain(metrics.get('reward/mean', 0.0)):.3f}",
                        kl="-" if kl is None else f"{_plain(kl):.4f}",
                        tps=f"{_plain(metrics.get(self.rate_key, 0.0)):.0f}", extra=extra)

    def print(self, *args: Any) -> None:
        if self.bar is not None:
            self.bar.console.print(*args)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


class PhaseTimer:
    """Accumulates wall time per named phase: ``with timer("rollout"): ...``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"time/{k}": v for k, v in self.seconds.items()}


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MiB.

    Linux's ``VmHWM`` where there is one: ``ru_maxrss`` survives ``execve``, so a process spawned
    by a large parent (``grouprl compare``, a benchmark's workers) would report the parent's peak.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


TENSOR_KINDS = ("PREEXISTING", "PARAMETER", "OPTIMIZER_STATE", "INPUT", "TEMPORARY", "ACTIVATION", "GRADIENT",
                "AUTOGRAD_DETAIL", "UNKNOWN")
"""The kinds PyTorch's profiler sorts CPU tensors into (its memory timeline's columns)."""


def peak_tensor_bytes(fn: Any) -> tuple[int, dict[str, int]]:
    """Run ``fn()`` under PyTorch's profiler: the peak bytes of CPU tensors allocated while it ran, and
    that moment's bytes by kind (:data:`TENSOR_KINDS`), whatever the allocator keeps besides. The kinds
    come from the autograd graph: run a backward pass inside ``fn`` for activations to count as such."""
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
