"""The agents recipe's results: success per environment on held-out episodes before GRPO (after
the warm start) and after it, with the standard error, the tool-call and failure rates, and
MT-GRPO's weights over the environments.

    python benchmarks/agents_cpu.py --seeds 0,1 --out runs/agents-cpu-bench    # train, then report
    python benchmarks/agents_cpu.py --runs runs/agents-cpu --out /tmp/report   # report only

Each seed runs ``mtgrpo train agents-cpu --seed S`` (about 15 minutes on 2 cores; extra
arguments after ``--`` are passed on). The standard error of a success rate is
``sqrt(p (1 - p) / n)`` with ``n`` the held-out episodes (not samples: the samples of one
episode are correlated, so counting them would understate it). Writes ``results.md`` and
``results.json`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any


def _metrics(run: Path, split: str) -> list[dict[str, Any]]:
    from mtgrpo.reporting import read_metrics

    return read_metrics(run, split=split)


def _episodes(run: Path) -> int:
    import yaml

    config = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    return int(config["environments"]["eval_size"])


def summarize_run(run: Path) -> dict[str, Any]:
    """Per environment: success before and after (first and last evaluation), its standard
    error, tool rates at both, the last MT-GRPO weight and the mean batch share."""
    evals, train = _metrics(run, "eval"), _metrics(run, "train")
    if len(evals) < 2 or evals[0]["step"] != 0:
        raise ValueError(f"{run}: needs an evaluation at step 0 and a later one "
                         "(eval_on_start: true and eval_steps)")
    n = _episodes(run)
    names = sorted(key.split("/")[1] for key in evals[0]
                   if key.startswith("tasks/") and key.endswith("/accuracy"))
    out: dict[str, Any] = {"run": str(run), "steps": evals[-1]["step"], "episodes": n,
                           "environments": {}}
    for name in names:
        row: dict[str, Any] = {}
        for when, record in (("before", evals[0]), ("after", evals[-1])):
            p = float(record[f"tasks/{name}/accuracy"])
            row[when] = p
            row[f"{when}_se"] = math.sqrt(p * (1 - p) / n)
            row[f"{when}_calls"] = record.get(f"tasks/{name}/tool_call_frequency")
            row[f"{when}_failures"] = record.get(f"tasks/{name}/tool_failure_frequency")
        row["weight"] = train[-1].get(f"tasks/{name}/weight")
        shares = [r[f"tasks/{name}/batch_share"] for r in train
                  if f"tasks/{name}/batch_share" in r]
        row["batch_share"] = sum(shares) / len(shares) if shares else None
        out["environments"][name] = row
    return out


def _pct(value: float | None, se: float | None = None) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f}" + ("" if se is None else f" ± {100 * se:.1f}")


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(summaries: list[dict[str, Any]]) -> str:
    lines = ["| seed run | environment | success before % | success after % | tool calls per "
             "episode (before → after) | failed calls (before → after) | final weight | "
             "mean batch share |", "|---|---|---:|---:|---|---|---:|---:|"]
    for summary in summaries:
        for name, row in summary["environments"].items():
            lines.append(
                f"| {Path(summary['run']).name} | {name} | "
                f"{_pct(row['before'], row['before_se'])} | "
                f"{_pct(row['after'], row['after_se'])} | "
                f"{_num(row['before_calls'])} → {_num(row['after_calls'])} | "
                f"{_pct(row['before_failures'])} → {_pct(row['after_failures'])} | "
                f"{_num(row['weight'], 3)} | {_num(row['batch_share'], 3)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="*", default=[], help="existing run directories")
    parser.add_argument("--seeds", default="", help="comma-separated seeds to train first")
    parser.add_argument("--out", required=True, help="where results.md/json (and runs) go")
    parser.add_argument("extra", nargs="*", help="after --: more `mtgrpo train` options")
    args = parser.parse_args(argv)
    out = Path(args.out)
    runs = [Path(r) for r in args.runs]
    for seed in [s for s in args.seeds.split(",") if s.strip()]:
        run = out / f"seed-{int(seed)}"
        command = [sys.executable, "-m", "mtgrpo.cli", "train", "agents-cpu", "--seed", seed,
                   "--output_dir", str(run), *args.extra]
        print("+", " ".join(command), flush=True)
        subprocess.run(command, check=True)
        runs.append(run)
    if not runs:
        parser.error("give --runs, --seeds or both")
    summaries = [summarize_run(run) for run in runs]
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(summaries, indent=2), encoding="utf-8")
    (out / "results.md").write_text(markdown(summaries), encoding="utf-8")
    print(markdown(summaries))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
