"""Early signs that a run is going wrong, read from its own metrics: entropy collapsing, KL jumping against its
recent median, all-equal groups step after step, a rollout correction masking most of the batch."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable
from typing import Any

ENTROPY_FLOOR = 0.25  # share of the start's entropy below which the policy stopped exploring
ENTROPY_START_STEPS = 2
KL_SPIKE = 3.0  # per-token KL above this multiple of its recent median (and above KL_SPIKE_MIN): an update too large
KL_SPIKE_MIN = 0.1
KL_WINDOW = 10
KL_WARMUP = 5  # steps of KL seen before spikes are judged: KL grows from 0 by design
ZERO_STD_HIGH = 0.75  # ZERO_STD_RUN steps in a row with this share of all-equal groups: little is left to learn
ZERO_STD_RUN = 3
MASKED_HIGH = 0.5  # share of policy tokens masked by a too narrow rollout correction


class HealthWatch:
    """Turns each step's metrics into ``health/*`` metrics and warnings.

    >>> watch = HealthWatch()
    >>> [watch.observe(s, {"policy/entropy": e})[1] for s, e in enumerate([2.0, 2.0, 1.0, 0.4], 1)][-1]
    ['entropy 0.20x of its start: the policy has stopped exploring (lower lr, or entropy_coef)']
    """

    def __init__(self, all_equal_teach_nothing: bool = True) -> None:
        # distilled, an all-equal group still carries the teacher's signal: no warning for many of them
        self.all_equal_teach_nothing = all_equal_teach_nothing
        self.entropies: list[float] = []
        self.kls: deque[float] = deque(maxlen=KL_WINDOW)
        self.zero_run = 0
        self.fired: dict[str, int] = {}  # warning kind -> the step it first fired
        self.active: set[str] = set()
        self.new: list[str] = []

    def observe(self, step: int, metrics: dict[str, Any]) -> tuple[dict[str, float], list[str]]:
        """(``health/*`` metrics, the warnings active at this step); ``self.new`` holds those quiet the step before."""
        out: dict[str, float] = {}
        warnings: list[tuple[str, str]] = []
        entropy = metrics.get("policy/entropy")
        if isinstance(entropy, int | float):
            self.entropies.append(float(entropy))
            start = statistics.fmean(self.entropies[:ENTROPY_START_STEPS])
            if len(self.entropies) > ENTROPY_START_STEPS and start > 0:
                out["health/entropy_ratio"] = ratio = entropy / start
                if ratio < ENTROPY_FLOOR:
                    warnings.append(("entropy", f"entropy {ratio:.2f}x of its start: the policy has stopped exploring "
                                                "(lower lr, or entropy_coef)"))
        kl = metrics.get("policy/kl")
        if isinstance(kl, int | float):
            if len(self.kls) >= KL_WARMUP:
                median = statistics.median(self.kls)
                if median > 0:
                    out["health/kl_spike"] = spike = kl / median
                    if spike > KL_SPIKE and kl > KL_SPIKE_MIN:
                        warnings.append(("kl", f"KL {kl:.2f} is {spike:.1f}x its recent median: an update too large "
                                               "(lower lr or max_grad_norm)"))
            self.kls.append(float(kl))
        zero = metrics.get("rollout/zero_std_frac")
        if isinstance(zero, int | float) and self.all_equal_teach_nothing:
            self.zero_run = self.zero_run + 1 if zero >= ZERO_STD_HIGH else 0
            out["health/zero_std_run"] = float(self.zero_run)
            if self.zero_run >= ZERO_STD_RUN:
                warnings.append(("zero_std", f"{self.zero_run} steps in a row with {ZERO_STD_HIGH:.0%}+ of groups "
                                             "all-equal: little left to learn (harder prompts, or dynamic_sampling)"))
        masked = metrics.get("rollout/is_masked_frac")
        if isinstance(masked, int | float) and masked >= MASKED_HIGH:
            mismatch = metrics.get("rollout/mismatch_kl")
            said = f" (rollout/mismatch_kl {mismatch:.1e})" if isinstance(mismatch, int | float) else ""
            warnings.append(("masked", f"the rollout correction dropped {masked:.0%} of the policy tokens: its band "
                                       f"is narrower than the rollout engine's mismatch{said}; widen icepop_low/high "
                                       "or sequence_mask_low/high, or use rollout_is token"))
        for kind, _ in warnings:
            self.fired.setdefault(kind, step)
        self.new = [message for kind, message in warnings if kind not in self.active]
        self.active = {kind for kind, _ in warnings}
        out["health/warnings"] = float(len(warnings))
        return out, [message for _, message in warnings]


def replay(records: Iterable[dict[str, Any]], watch: HealthWatch | None = None) -> list[tuple[int, str]]:
    """(step, warning) for each new warning over a run's logged steps; ``watch`` ends in the state the records
    leave it in, so a resumed run carries on where it stopped."""
    watch, out = watch or HealthWatch(), []
    for r in records:
        if not any(k in r for k in ("rollout/zero_std_frac", "policy/entropy", "loss/total")):
            continue  # an evaluation line (a training step logs its rollout even when its update was skipped)
        watch.observe(int(r.get("step", 0)), r)
        out += [(int(r.get("step", 0)), w) for w in watch.new]
    return out
