"""``mtgrpo analyze`` (alias ``thm3-check``): the gradient-noise ("Theorem 3") check.

Draws synthetic rewards from a Gaussian copula (default) or reads real rollouts
(``--rollouts rollouts.jsonl`` or ``.npz``), runs :func:`mtgrpo.analysis.analyze`, prints a
summary, and writes ``analysis.json`` and ``money_plot.png`` to ``--out``.

Exit status: 0 when NA's realised / predicted MSE ratio lies inside ``--band``, 1 when it
does not, 2 on bad input (malformed option, inconsistent sizes, unreadable file).

Defaults follow the ``multireward-grpo`` example: ``C = [[1, ρ, 0], [ρ, 1, 0], [0, 0, 1]]``
with ``ρ = 0.5``, weights ``(1, 1, 0.5)``, 40 prompts × 200 seeds × m = 8.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mtgrpo.analysis import AnalysisResult

__all__ = ["add_arguments", "run"]

DEFAULT_RHO = 0.5  # DEFAULT_* follow the multireward-grpo example (module docstring)
DEFAULT_CHANNELS = 3
DEFAULT_PROMPTS = 40
DEFAULT_SEEDS = 200
DEFAULT_GROUP_SIZE = 8
DEFAULT_MIN_SEEDS = 2
DEFAULT_OUT = "runs/analyze"
SYNTHETIC_ONLY = ("rho", "channels", "correlation", "prompts", "seeds", "marginals",
                  "success_range")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the command's options on ``parser``."""
    synthetic = parser.add_argument_group("synthetic rewards (the default source)")
    synthetic.add_argument("--rho", type=float, help="correlation of channels 0 and 1 "
                           f"(default {DEFAULT_RHO})")
    synthetic.add_argument("--channels", type=int, metavar="R",
                           help=f"number of reward channels (default {DEFAULT_CHANNELS})")
    synthetic.add_argument("--correlation", metavar="C",
                           help="full channel correlation matrix, rows separated by ';', e.g. "
                           "'1,0.5,0;0.5,1,0;0,0,1' (instead of --rho / --channels)")
    synthetic.add_argument("--prompts", type=int,
                           help=f"number of prompts P (default {DEFAULT_PROMPTS})")
    synthetic.add_argument("--seeds", type=int, help="independent groups per prompt S "
                           f"(default {DEFAULT_SEEDS})")
    synthetic.add_argument("--marginals", metavar="KIND[:SCALE],...",
                           help="one marginal per channel: binary, gaussian or uniform with an "
                           "optional scale (default: binary, then gaussian with spreads "
                           "0.25 to 2)")
    synthetic.add_argument("--success-range", metavar="LOW,HIGH",
                           help="range of the per-prompt solve probability of binary channels "
                           "(default 0.1,0.9)")
    rollouts = parser.add_argument_group("real rollouts (instead of synthetic rewards)")
    rollouts.add_argument("--rollouts", metavar="FILE",
                          help="the trainer's rollouts.jsonl, or an .npz with 'rewards' "
                          "[P, S, m, R]")
    rollouts.add_argument("--min-seeds", type=int, help="keep prompts with at least this many "
                          f"groups (default {DEFAULT_MIN_SEEDS})")
    common = parser.add_argument_group("analysis and output")
    common.add_argument("-m", "--group-size", type=int,
                        help=f"completions per group (default {DEFAULT_GROUP_SIZE}; with "
                        "--rollouts: the most common group size in the file)")
    common.add_argument("--weights", metavar="W1,W2,...",
                        help="reward weights, one per channel (default 1,1,0.5,... for "
                        "synthetic rewards; the file's weights or all 1 for rollouts)")
    common.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    # ALGORITHMS.md: NA's realised / predicted MSE is about 1, within 15 %.
    common.add_argument("--band", default="0.85,1.15", metavar="LOW,HIGH",
                        help="accepted NA realised / predicted ratio (default 0.85,1.15)")
    common.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                        help=f"output directory (default {DEFAULT_OUT})")
    common.add_argument("--no-plot", action="store_true", help="do not write money_plot.png")


def run(args: argparse.Namespace) -> int:
    """Run the check; 0 = NA ratio inside the band, 1 = outside, 2 = bad input."""
    from rich.console import Console

    from mtgrpo.analysis import analyze, print_summary

    try:
        band = _floats(args.band, "--band", count=2)
        if not band[0] < band[1]:
            raise ValueError(f"--band needs LOW < HIGH, got {args.band!r}")
        job = _rollouts_job(args) if args.rollouts else _synthetic_job(args)
        weights = _weights(args.weights, job)
        result = analyze(job["rewards"], weights, seed=args.seed, channels=job["channels"],
                         prompt_ids=job["prompt_ids"])
    except (ValueError, TypeError, FileNotFoundError) as error:
        print(f"mtgrpo analyze: error: {error}", file=sys.stderr)
        return 2  # exit 2: bad input, never a verdict (module docstring)
    console = Console()
    if job["source"]["kind"] == "rollouts":
        _describe_rollouts(console, job["source"], result)
    print_summary(result, console)
    passed = _verdict(console, result, (band[0], band[1]))
    _write_outputs(console, args, result, job["source"], (band[0], band[1]), passed)
    return 0 if passed else 1


def _floats(text: str, option: str, count: int | None = None) -> list[float]:
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(
            f"{option} must be comma-separated numbers, got {text!r}; e.g. 1,1,0.5"
        ) from None
    if count is not None and len(values) != count:
        raise ValueError(f"{option} needs {count} comma-separated numbers, got {text!r}")
    return values


def _parse_correlation(text: str) -> list[list[float]]:
    rows = [_floats(row, "--correlation") for row in text.split(";") if row.strip()]
    if not rows or any(len(row) != len(rows) for row in rows):
        raise ValueError(
            f"--correlation must be a square matrix, rows separated by ';' and entries by ',' "
            f"(e.g. '1,0.5,0;0.5,1,0;0,0,1'), got {text!r} with row lengths "
            f"{[len(row) for row in rows]}"
        )
    return rows


def _refuse(args: argparse.Namespace, names: tuple[str, ...], reason: str) -> None:
    given = [f"--{name.replace('_', '-')}" for name in names if getattr(args, name) is not None]
    if given:
        raise ValueError(f"{', '.join(given)} {reason}")


def _correlation(args: argparse.Namespace) -> Any:
    from mtgrpo.analysis import correlation_matrix, validate_correlation

    if args.correlation is None:
        rho = DEFAULT_RHO if args.rho is None else args.rho
        channels = DEFAULT_CHANNELS if args.channels is None else args.channels
        return correlation_matrix(rho, channels)
    _refuse(args, ("rho",), "cannot be combined with --correlation; give one of them")
    matrix = validate_correlation(_parse_correlation(args.correlation))
    if args.channels is not None and args.channels != len(matrix):
        raise ValueError(
            f"--channels {args.channels} disagrees with the {len(matrix)}x{len(matrix)} "
            "--correlation; drop --channels or fix the matrix"
        )
    return matrix


def _synthetic_job(args: argparse.Namespace) -> dict[str, Any]:
    from mtgrpo.analysis import ChannelMarginal, default_marginals, synthetic_rewards

    _refuse(args, ("min_seeds",), "applies to --rollouts only")
    correlation = _correlation(args)
    marginals = (
        default_marginals(len(correlation)) if args.marginals is None
        else tuple(ChannelMarginal.parse(text) for text in args.marginals.split(","))
    )
    success = (0.1, 0.9) if args.success_range is None else tuple(
        _floats(args.success_range, "--success-range", count=2))
    data = synthetic_rewards(
        correlation,
        num_prompts=DEFAULT_PROMPTS if args.prompts is None else args.prompts,
        num_seeds=DEFAULT_SEEDS if args.seeds is None else args.seeds,
        group_size=DEFAULT_GROUP_SIZE if args.group_size is None else args.group_size,
        marginals=marginals,
        success_range=success,
        seed=args.seed,
    )
    source = {
        "kind": "synthetic",
        "correlation": correlation.tolist(),
        "marginals": [vars(m) for m in data.marginals],
        "success_range": list(success),
    }
    names = [f"r{i}_{m.kind}" for i, m in enumerate(data.marginals)]
    return {"rewards": data.rewards, "channels": names, "prompt_ids": None,
            "source": source, "weights": None}


def _rollouts_job(args: argparse.Namespace) -> dict[str, Any]:
    from mtgrpo.analysis import load_rollouts

    _refuse(args, SYNTHETIC_ONLY, "applies to synthetic rewards only; drop it or --rollouts")
    min_seeds = DEFAULT_MIN_SEEDS if args.min_seeds is None else args.min_seeds
    data = load_rollouts(args.rollouts, min_seeds=min_seeds, group_size=args.group_size)
    source = {
        "kind": "rollouts",
        "path": str(args.rollouts),
        "min_seeds": min_seeds,
        "skipped_groups": data.skipped_groups,
        "dropped_prompts": data.dropped_prompts,
        "truncated_groups": data.truncated_groups,
    }
    return {"rewards": data.rewards, "channels": list(data.channels),
            "prompt_ids": list(data.prompt_ids), "source": source, "weights": data.weights}


def _describe_rollouts(console: Any, source: dict[str, Any], result: AnalysisResult) -> None:
    console.print(
        f"read {result.num_prompts} prompts × {result.num_seeds} groups of "
        f"{result.group_size} from {source['path']} (skipped {source['skipped_groups']} groups "
        f"of other sizes, dropped {source['dropped_prompts']} prompts with fewer than "
        f"{source['min_seeds']} groups, left out {source['truncated_groups']} groups beyond the "
        f"first {result.num_seeds} of their prompt)"
    )


def _weights(text: str | None, job: dict[str, Any]) -> list[float]:
    num_channels = job["rewards"].shape[-1]
    if text is not None:
        weights = _floats(text, "--weights")
    elif job["weights"] is not None:
        weights = [float(w) for w in job["weights"]]
    elif job["source"]["kind"] == "synthetic":
        # (1, 1, 0.5, ...): the multireward-grpo example's weights.
        weights = [1.0 if channel < 2 else 0.5 for channel in range(num_channels)]
    else:
        weights = [1.0] * num_channels
    if len(weights) != num_channels:
        raise ValueError(
            f"--weights has {len(weights)} values ({text}) but the rewards have {num_channels} "
            f"channels {job['channels']}; give one weight per channel"
        )
    return weights


def _verdict(console: Any, result: AnalysisResult, band: tuple[float, float]) -> bool:
    from mtgrpo.analysis import in_band

    s = result.summary
    passed = in_band(s.na.ratio, band)
    status = "[bold green]PASS[/]" if passed else "[bold red]FAIL[/]"
    console.print(
        f"{status}: NA realised / predicted = {s.na.ratio:.3f} "
        f"({'inside' if passed else 'outside'} the band [{band[0]:g}, {band[1]:g}])"
    )
    if result.num_channels == 1:  # AN and NA coincide for one channel
        return passed
    # AN over-weights the highest-variance channel (ALGORITHMS.md); NA keeps it to its weight.
    widest = int(result.channel_std.mean(axis=0).argmax())
    console.print(
        f"AN gives '{result.channels[widest]}' (largest within-group std) "
        f"{s.an.influence_share[widest]:.2f} of the influence for "
        f"{s.weight_share[widest]:.2f} of the weight; NA gives it "
        f"{s.na.influence_share[widest]:.2f}."
    )
    return passed


def _write_outputs(
    console: Any,
    args: argparse.Namespace,
    result: AnalysisResult,
    source: dict[str, Any],
    band: tuple[float, float],
    passed: bool,
) -> None:
    from mtgrpo.analysis import save_money_plot

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"source": source, "band": list(band), "passed": passed, **result.to_dict()}
    report = out / "analysis.json"
    # Strict JSON: NaN is not JSON, and other parsers refuse it.
    report.write_text(json.dumps(record, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    written = [report]
    if not args.no_plot:
        written.append(save_money_plot(result, out / "money_plot.png", band=band))
    console.print("wrote " + ", ".join(str(path) for path in written))
