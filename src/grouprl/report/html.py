"""The run report as one static HTML file (inline CSS, no scripts, the PNGs beside it), so it opens from disk or
an archive. Every piece of run data is HTML-escaped: model output must never become markup."""

from __future__ import annotations

import json
import math
from html import escape
from typing import Any, NamedTuple

from grouprl import __version__


class Plot(NamedTuple):
    file: str  # relative to the report folder
    caption: str


class StepSamples(NamedTuple):
    """Logged completions of one step: the ``rows`` shown, how many were logged, the mean reward over all."""

    step: int
    rows: list[dict[str, Any]]
    total: int
    mean_reward: float | None


CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d2433;margin:0;background:#f6f7f9}
main{max-width:1180px;margin:0 auto;padding:24px 28px 60px}
h1{font-size:24px;margin:0 0 4px}
h2{font-size:19px;margin:34px 0 10px;border-bottom:1px solid #dde1e7;padding-bottom:4px}
.sub{color:#5b6475;margin:0 0 6px}.sub a{color:#2456a6}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin-top:16px}
.card{background:#fff;border:1px solid #dde1e7;border-radius:8px;padding:10px 16px;min-width:150px}
.card .v{font-size:21px;font-weight:600}.card .k{color:#5b6475;font-size:13px}
table{border-collapse:collapse;background:#fff;font-size:14px;margin:6px 0}
th,td{border:1px solid #dde1e7;padding:5px 9px;text-align:left;vertical-align:top}
th{background:#eef1f5}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.up{color:#17803d;font-weight:600}.down{color:#b42318;font-weight:600}
figure{background:#fff;border:1px solid #dde1e7;border-radius:8px;margin:0 0 16px;padding:10px}
figure img{max-width:100%;height:auto;display:block;margin:0 auto}
figcaption{color:#5b6475;font-size:13px;margin-top:6px}
details{background:#fff;border:1px solid #dde1e7;border-radius:8px;margin:0 0 10px;padding:6px 12px}
summary{cursor:pointer;font-weight:600;padding:4px 0}
pre{white-space:pre-wrap;word-break:break-word;margin:0;font:13px/1.4 ui-monospace,Menlo,Consolas,monospace}
td pre{max-height:16em;overflow:auto}.same{color:#8a93a3;font-style:italic}
.config pre{background:#fff;border:1px solid #dde1e7;border-radius:8px;padding:12px;max-height:40em;overflow:auto}
.note{color:#5b6475;font-size:13px}
.turn{border-left:3px solid #2456a6;padding:2px 8px;margin:4px 0}.turn.env{border-color:#b8bec9;background:#f6f7f9}
.turn .role{color:#5b6475;font-size:12px;text-transform:uppercase}
"""
HIGHER_IS_BETTER = ("accuracy", "mean_reward", "pass@", "success")


def fmt(value: Any) -> str:
    """A number as a person reads it: 4 significant digits, scientific when tiny, '–' when absent."""
    if value is None:
        return "–"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return escape(str(value))
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return str(value)
    if value != 0 and abs(value) < 1e-3:
        return f"{value:.2e}"
    return f"{value:,.0f}" if abs(value) >= 10_000 else f"{value:.4g}"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min {secs} s" if minutes else f"{seconds:.1f} s"


def _card(label: str, value: str) -> str:
    return f'<div class="card"><div class="v">{value}</div><div class="k">{escape(label)}</div></div>'


def _cards(summary: dict[str, Any]) -> str:
    cards = [_card("last step", fmt(summary["last_step"])), _card("wall time", fmt_duration(summary["wall_time_s"]))]
    if summary["reward_smoothed_final"] is not None:
        cards.append(_card("final reward (smoothed)", fmt(summary["reward_smoothed_final"])))
    best = summary["best"].get("reward/mean")
    if best:
        cards.append(_card(f"best single-step reward (step {fmt(best['step'])})", fmt(best["value"])))
    before, after = summary["eval_before"] or {}, summary["eval_after"] or {}
    if "accuracy" in before or "accuracy" in after:
        cards.append(_card("held-out accuracy, before → after",
                           f"{fmt(before.get('accuracy'))} → {fmt(after.get('accuracy'))}"))
    if summary["mean_step_time_s"] is not None:
        cards.append(_card("seconds per step (mean)", fmt(summary["mean_step_time_s"])))
    return '<div class="cards">' + "".join(cards) + "</div>"


def _delta(name: str, before: Any, after: Any) -> str:
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (before, after)):
        return '<td class="n">–</td>'
    change = after - before
    good = name.startswith(HIGHER_IS_BETTER)
    css = ("up" if change > 0 else "down" if change < 0 else "") if good else ""
    return f'<td class="n {css}">{"+" if change > 0 else ""}{fmt(change)}</td>'


def _eval_table(summary: dict[str, Any]) -> str:
    before, after = summary["eval_before"], summary["eval_after"]
    if not before and not after:
        return '<p class="note">No evaluation was logged.</p>'
    before, after = before or {}, after or {}
    names = sorted(set(before) | set(after), key=lambda n: (not n.startswith(HIGHER_IS_BETTER), n))
    rows = "".join(
        f"<tr><td>{escape(n)}</td><td class='n'>{fmt(before.get(n))}</td><td class='n'>{fmt(after.get(n))}</td>"
        f"{_delta(n, before.get(n), after.get(n))}</tr>"
        for n in names
    )
    source = f'<p class="note">From {escape(str(summary["eval_source"]))}.</p>'
    return f"<table><tr><th>metric</th><th>before</th><th>after</th><th>change</th></tr>{rows}</table>{source}"


def _plots(plots: list[Plot]) -> str:
    if not plots:
        return '<p class="note">No metrics were logged yet, so there is nothing to plot.</p>'
    return "".join(
        f'<figure><img src="{escape(p.file)}" alt="{escape(p.caption)}">'
        f"<figcaption>{escape(p.caption)}</figcaption></figure>"
        for p in plots
    )


def _text(value: Any) -> str:
    """A prompt (text or chat messages) or completion as escaped text."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=1)
    return escape(text)


def _trajectory(messages: list[dict[str, Any]], opening: int = 1) -> str:
    """A conversation turn by turn, the policy's turns marked (the first ``opening`` messages are the reset's)."""
    out = []
    for i, m in enumerate(messages):
        role = str(m.get("role", ""))
        kind = "policy" if role == "assistant" and i >= opening else "env"
        name = f" ({m['name']})" if m.get("name") else ""
        out.append(f'<div class="turn {kind}"><div class="role">{escape(role + name)}</div>'
                   f"<pre>{_text(m.get('content', ''))}</pre></div>")
    return "".join(out)


AGENT_COLUMNS = (("turns", "turns"), ("success", "success"), ("end_reason", "ended"))  # an agent's record's


def _is_agent(block: StepSamples) -> bool:
    return any(isinstance(r.get("trajectory"), list) for r in block.rows)


def _sample_table(block: StepSamples) -> str:
    fn_names = sorted({name for r in block.rows if isinstance(r.get("rewards"), dict) for name in r["rewards"]})
    agent = _is_agent(block)
    extra = AGENT_COLUMNS if agent else ()
    head = "".join(f"<th>{escape(n)}</th>" for n in fn_names) + "".join(f"<th>{label}</th>" for _, label in extra)
    rows, previous = [], object()
    for i, r in enumerate(block.rows):
        prompt = r.get("prompt")
        prompt_cell = '<span class="same">same prompt</span>' if prompt == previous else f"<pre>{_text(prompt)}</pre>"
        previous = prompt
        per_fn = r.get("rewards") if isinstance(r.get("rewards"), dict) else {}
        cells = "".join(f'<td class="n">{fmt(per_fn.get(n))}</td>' for n in fn_names)
        cells += "".join(f'<td class="n">{escape(str(r.get(key, "")))}</td>' for key, _ in extra)
        trajectory = r.get("trajectory")
        body = (_trajectory(trajectory, int(r.get("opening", 1))) if isinstance(trajectory, list)
                else f"<pre>{_text(r.get('completion', ''))}</pre>")
        rows.append(
            f'<tr><td class="n">{i + 1}</td><td>{prompt_cell}</td><td>{body}</td>'
            f'<td class="n">{fmt(r.get("reward"))}</td>{cells}<td class="n">{fmt(r.get("advantage"))}</td></tr>'
        )
    what = "trajectory (policy turns marked)" if agent else "completion"
    return (f"<table><tr><th>#</th><th>prompt</th><th>{what}</th><th>reward</th>{head}<th>advantage</th></tr>"
            + "".join(rows) + "</table>")


def _step_groups(samples: list[StepSamples]) -> str:
    """For one group of the latest step that logged GiGPO's anchors: each turn's state and anchor group."""
    block = next((b for b in reversed(samples) if any("step_groups" in r for r in b.rows)), None)
    if block is None:
        return ""
    first = next(r for r in block.rows if "step_groups" in r)
    rows = [r for r in block.rows if "step_groups" in r and r.get("prompt") == first.get("prompt")]
    counts: dict[int, int] = {}
    for r in rows:
        for g in r["step_groups"]:
            counts[g] = counts.get(g, 0) + 1
    letters: dict[int, str] = {}
    for g in (g for r in rows for g in r["step_groups"] if counts[g] > 1):
        letters.setdefault(g, chr(ord("A") + len(letters) % 26))
    width = max(len(r["step_groups"]) for r in rows)
    head = "".join(f"<th>turn {t + 1}</th>" for t in range(width))
    body = []
    for i, r in enumerate(rows):
        cells = []
        for t in range(width):
            if t >= len(r["step_groups"]):
                cells.append("<td></td>")
                continue
            key = str(r.get("state_keys", [""] * width)[t])
            label = letters.get(r["step_groups"][t], "alone")
            advantage = r.get("turn_advantages", [None] * width)[t]
            cells.append(f'<td><b>{escape(label)}</b> <span class="same">A={fmt(advantage)}</span>'
                         f"<pre>{escape(key[:80])}</pre></td>")
        body.append(f'<tr><td class="n">{i + 1}</td><td class="n">{fmt(r.get("reward"))}</td>{"".join(cells)}</tr>')
    return (f"<h2>Step groups (GiGPO), step {fmt(block.step)}</h2><p class=\"note\">The {len(rows)} trajectories "
            "of one reset, turn by turn: the state each turn started from, its anchor group (turns with the same "
            "letter started from the same state and were compared with each other; <b>alone</b>: no other turn "
            "shared its state, so its step advantage is 0) and the turn's advantage A.</p>"
            f"<table><tr><th>#</th><th>reward</th>{head}</tr>{''.join(body)}</table>")


def _health(summary: dict[str, Any]) -> str:
    """The early-warning signs of the run, each with the step it fired."""
    found = summary.get("health")
    if found is None:
        return ""
    if not found:
        body = ('<p class="note">None fired: entropy stayed above a quarter of its start, KL had no spike, and '
                "there was always something to learn from.</p>")
    else:
        body = ("<table><tr><th>step</th><th>sign</th></tr>"
                + "".join(f'<tr><td class="n">{fmt(step)}</td><td>{escape(text)}</td></tr>' for step, text in found)
                + "</table>")
    return ("<h2>Early warnings</h2><p class=\"note\">Signs seen before a run's held-out accuracy falls back: "
            "the policy's entropy collapsing, KL jumping to several times its recent median, steps in a row "
            f"where almost every group's rewards were equal.</p>{body}")


def _samples(samples: list[StepSamples]) -> str:
    if not samples:
        return '<p class="note">No completions were logged.</p>'
    out = []
    for i, block in enumerate(samples):
        mean = f", mean reward {fmt(block.mean_reward)}" if block.mean_reward is not None else ""
        shown = f"{len(block.rows)} of {block.total}" if len(block.rows) < block.total else f"{block.total}"
        is_open = " open" if i == len(samples) - 1 else ""
        kind = "trajectories" if _is_agent(block) else "completions"
        out.append(f"<details{is_open}><summary>Step {fmt(block.step)}: {shown} {kind}{mean}</summary>"
                   f"{_sample_table(block)}</details>")
    return "".join(out)


def _metrics_table(summary: dict[str, Any]) -> str:
    if not summary["final"]:
        return '<p class="note">No metrics were logged.</p>'
    rows = []
    for key, value in summary["final"].items():
        best = summary["best"].get(key)
        best_text = f"{fmt(best['value'])} (step {fmt(best['step'])})" if best else ""
        rows.append(f"<tr><td>{escape(key)}</td><td class='n'>{fmt(value)}</td><td class='n'>{best_text}</td></tr>")
    return "<table><tr><th>metric</th><th>last value</th><th>best</th></tr>" + "".join(rows) + "</table>"


def _run_summary(extra: dict[str, Any]) -> str:
    if not extra:
        return ""
    rows = "".join(
        f"<tr><td>{escape(str(k))}</td><td><pre>{_text(v if isinstance(v, str) else json.dumps(v, default=str))}"
        "</pre></td></tr>"
        for k, v in extra.items()
    )
    return f"<h2>Run summary</h2><table>{rows}</table>"


def render_html(summary: dict[str, Any], plots: list[Plot], samples: list[StepSamples], config_text: str | None,
                links: list[tuple[str, str]]) -> str:
    """The whole report page. ``links`` are (relative href, text) pairs to the run's raw files."""
    name = escape(summary["name"])
    raw = " · ".join(f'<a href="{escape(href)}">{escape(text)}</a>' for href, text in links)
    raw = f" · raw files: {raw}" if raw else ""
    config = f"<pre>{escape(config_text)}</pre>" if config_text is not None else '<p class="note">No config.yaml.</p>'
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>grouprl report: {name}</title><style>{CSS}</style></head>
<body><main>
<h1>Run report: {name}</h1>
<p class="sub">{escape(summary["run_dir"])} · {fmt(summary["num_records"])} metric lines{raw}</p>
{_cards(summary)}
<h2>Evaluation before and after training</h2>
{_eval_table(summary)}
<h2>Training curves</h2>
{_plots(plots)}
{_health(summary)}
<h2>Sample {"trajectories" if any(_is_agent(b) for b in samples) else "completions"}</h2>
{_samples(samples)}
{_step_groups(samples)}
<h2>Last logged metrics</h2>
{_metrics_table(summary)}
{_run_summary(summary["run_summary"])}
<h2>Resolved config</h2>
<div class="config">{config}</div>
<p class="note">Generated by grouprl {escape(__version__)}.</p>
</main></body></html>
"""
