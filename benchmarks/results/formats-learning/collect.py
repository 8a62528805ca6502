"""usage: collect.py RUNS_DIR WALLS_TXT OUT_DIR

Held-out evaluations and step times of the format-comparison runs -> results.jsonl and tables.md."""

import json
import statistics
import sys
from pathlib import Path

RUNS = Path(sys.argv[1])  # the run folders: <demo>-<format>-s<seed>/metrics.jsonl
WALLS = {w.split()[0]: float(w.split("wall_s=")[1]) for w in Path(sys.argv[2]).read_text().splitlines()
         if "wall_s=" in w and "rc=0" in w}  # run_pair.sh's walls.txt: one line per finished command
DEMOS = {"arith": ("arithmetic", "eval/accuracy"), "agent": ("guess-number", "eval/success"),
         "agent40": ("guess-number, 40 steps", "eval/success")}


def load(demo, fmt, seed):
    path = RUNS / f"{demo}-{fmt}-s{seed}" / "metrics.jsonl"
    if not path.exists():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def main(out_dir):
    out_dir = Path(out_dir)
    records, md = [], []
    for demo, (name, key) in DEMOS.items():
        table, times = {}, {}
        for fmt in ("bf16", "fp32"):
            for seed in (0, 1, 2):
                rows = load(demo, fmt, seed)
                if rows is None or f"{demo}-{fmt}-s{seed}" not in WALLS:
                    continue
                steps = [r for r in rows if "time/step" in r]
                compile_s = sum(r.get("time/compile", 0.0) for r in steps)
                later = [r["time/step"] for r in steps if r["step"] > 1]
                times[(fmt, seed)] = (statistics.mean(later), statistics.median(later), compile_s,
                                      WALLS[f"{demo}-{fmt}-s{seed}"], len(steps))
                for r in rows:
                    if key in r:
                        table[(fmt, seed, r["step"])] = r[key]
                        records.append({"demo": name, "format": fmt, "seed": seed, "step": r["step"],
                                        key.split("/")[1]: r[key],
                                        "mean_reward": r.get("eval/mean_reward"),
                                        **{k.split("/")[1]: v for k, v in r.items() if k.startswith("eval/pass@")}})
        if not table:
            continue
        seeds = sorted({s for _, s, _ in table})
        steps = sorted({t for _, _, t in table})
        md.append(f"### {name}: held-out {key.split('/')[1]}\n")
        md.append("| step | " + " | ".join(f"bf16 s{s}" for s in seeds) + " | **bf16 mean (min-max)** | "
                  + " | ".join(f"fp32 s{s}" for s in seeds) + " | **fp32 mean (min-max)** | bf16 - fp32 |")
        md.append("|---:|" + "---:|" * (2 * len(seeds) + 3))
        for t in steps:
            cells, means = [], {}
            for fmt in ("bf16", "fp32"):
                vals = [table.get((fmt, s, t)) for s in seeds]
                cells += [f"{v:.3f}" if v is not None else "-" for v in vals]
                got = [v for v in vals if v is not None]
                means[fmt] = statistics.mean(got) if got else None
                cells.append(f"**{means[fmt]:.3f}** ({min(got):.3f}-{max(got):.3f})" if got else "-")
            diff = f"{means['bf16'] - means['fp32']:+.3f}" if None not in means.values() else "-"
            md.append(f"| {t} | " + " | ".join(cells) + f" | {diff} |")
        md.append("")
        md.append("| run | steps | s/step mean (median), steps 2+ | compile s (in step 1) | wall s (whole command) |")
        md.append("|---|---:|---:|---:|---:|")
        for (fmt, seed), (mean, med, comp, wall, n) in sorted(times.items()):
            md.append(f"| {fmt} seed {seed} | {n} | {mean:.1f} ({med:.1f}) | {comp:.0f} | {wall:.0f} |")
        md.append("")
    (out_dir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (out_dir / "tables.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main(sys.argv[3])
