"""The MT-GRPO vs baselines grid (``benchmarks/mtgrpo_vs_baselines.py``): the method table's
overrides, option checks, the dry run, Δm% paired by seed, the verdict on hand-built
summaries, and a smoke grid on the tiny model that resumes and skips finished runs."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import replace as dataclasses_replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from mtgrpo.config import run_config_from_dict
from mtgrpo.reporting.compare import RunHistory, RunSummary, aggregate_seeds
from script_loader import ROOT, load_script

bench = load_script("benchmarks/mtgrpo_vs_baselines.py")

TASKS = ("countdown:easy", "arc_1d:easy")


def write_config(tmp_path: Path, model_path: Path | str, **extra: Any) -> Path:
    """A tiny grid base: two easy tasks, 2 prompts × 2 completions, 4 new tokens, eval and a
    checkpoint every step, and a two-step supervised warm start."""
    config = {
        "model": {"name_or_path": str(model_path), "dtype": "float32"},
        "tasks": {"tasks": list(TASKS), "train_size": 8, "eval_size": 2, "workers": 0,
                  "prompt_format": "chat", "cache_dir": str(tmp_path / "cache")},
        "sft": {"num_examples": 2, "max_steps": 2, "per_device_train_batch_size": 4,
                "learning_rate": 1e-3, "max_prompt_length": 256, "logging_steps": 1},
        "output_dir": str(tmp_path / "unused"),
        "max_steps": 2, "num_generations": 2, "prompts_per_step": 2,
        "per_device_train_batch_size": 4, "max_completion_length": 4, "max_prompt_length": 256,
        "eval_steps": 1, "num_generations_eval": 1, "save_steps": 1, "learning_rate": 1e-3,
        "task_weighting": "mt_grpo",
        "task_weighting_params": {"lam": 0.5, "optimizer": "sgd", "step_size": 0.3},
        "batch_construction": "ratio_preserving",
        "batch_construction_params": {"oversample_factor": 2, "max_resample_rounds": 1,
                                      "acceptance_aware": False},
        "zero_gradient_filter": "none",
        **extra,
    }
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- method table


def test_method_table_sets_the_intended_weighting_sampler_and_clip() -> None:
    table = bench.method_table((0.25, 1.0))
    assert list(table) == ["grpo", "dapo", "sec_grpo", "sec_dapo", "mtgrpo_l0.25", "mtgrpo_l1",
                           "rp_uniform", "mtgrpo_no_rp", "mtgrpo_val"]
    expected = {  # name: (weighting, batch construction, ε_high); None = symmetric (= ε)
        "grpo": ("uniform", "iid", None), "dapo": ("uniform", "dynamic", 0.28),
        "sec_grpo": ("sec", "iid", None), "sec_dapo": ("sec", "dynamic", 0.28),
        "mtgrpo_l0.25": ("mt_grpo", "ratio_preserving", 0.28),
        "mtgrpo_l1": ("mt_grpo", "ratio_preserving", 0.28),
        "rp_uniform": ("uniform", "ratio_preserving", 0.28),
        "mtgrpo_no_rp": ("mt_grpo", "dynamic", 0.28),
        "mtgrpo_val": ("mt_grpo", "ratio_preserving", 0.28),
    }
    base = {"task_weighting": "uniform", "batch_construction": "iid"}
    for name, (weighting, sampler, eps) in expected.items():
        overrides = bench.method_overrides(table[name], base)
        assert (overrides["task_weighting"], overrides["batch_construction"],
                overrides["epsilon_high"]) == (weighting, sampler, eps), name
    lams = {name: bench.method_overrides(table[name], base)["task_weighting_params"].get("lam")
            for name in table}
    assert lams == {"grpo": None, "dapo": None, "sec_grpo": None, "sec_dapo": None,
                    "mtgrpo_l0.25": 0.25, "mtgrpo_l1": 1.0, "rp_uniform": None,
                    "mtgrpo_no_rp": 0.25, "mtgrpo_val": 0.25}  # these use the first λ
    assert [m.name for m in table.values() if m.is_mtgrpo] == ["mtgrpo_l0.25", "mtgrpo_l1",
                                                               "mtgrpo_val"]
    signals = {name: bench.method_overrides(table[name], base).get("task_weighting_signal")
               for name in table}
    assert signals == {name: "validation" if name == "mtgrpo_val" else None for name in table}


def test_parameters_are_inherited_only_where_they_apply() -> None:
    table = bench.method_table((0.25,))
    base = {"task_weighting": "mtgrpo",  # an alias of mt_grpo
            "task_weighting_params": {"lam": 0.5, "optimizer": "sgd", "step_size": 0.3},
            "batch_construction": "rp",
            "batch_construction_params": {"oversample_factor": 2, "max_resample_rounds": 4,
                                          "acceptance_aware": False}}
    mt = bench.method_overrides(table["mtgrpo_l0.25"], base)
    assert mt["task_weighting_params"] == {"lam": 0.25, "optimizer": "sgd", "step_size": 0.3}
    assert mt["batch_construction_params"] == base["batch_construction_params"]
    dapo = bench.method_overrides(table["dapo"], base)
    assert dapo["task_weighting_params"] == {}
    # dynamic sampling shares M_os and N_rs with the RP-sampler, not its AAS switch
    assert dapo["batch_construction_params"] == {"oversample_factor": 2, "max_resample_rounds": 4}
    assert bench.method_overrides(table["grpo"], base)["batch_construction_params"] == {}
    assert bench.method_overrides(table["sec_dapo"], base)["task_weighting_params"] == {}
    # on a base without MT-GRPO, MT-GRPO runs with the released code's settings
    uniform = bench.method_overrides(table["mtgrpo_l0.25"], {"task_weighting": "uniform"})
    assert uniform["task_weighting_params"] == {**bench.MTGRPO_DEFAULT_PARAMS, "lam": 0.25}
    assert uniform["improvement_reduction"] == "sum"  # the clip is meant for the summed I_k
    assert "improvement_reduction" not in mt  # the base's own reduction stays


def test_every_method_resolves_to_a_valid_run_config() -> None:
    base = {"model": "m", "task_weighting": "mt_grpo", "batch_construction": "ratio_preserving",
            "batch_construction_params": {"oversample_factor": 2, "acceptance_aware": False}}
    for method in bench.method_table().values():
        # a method reading the validation split needs one in the base config
        split = {"tasks": {"tasks": list(TASKS), "validation_size": 2}} \
            if method.reads_validation else {}
        run = run_config_from_dict({**base, **split, **bench.method_overrides(method, base)})
        expected = 0.2 if method.epsilon_high is None else 0.28
        assert run.training.resolved_epsilon_high == expected, method.name


def test_select_methods_keeps_table_order_and_expands_mtgrpo() -> None:
    table = bench.method_table((0.25, 1.0))
    chosen = bench.select_methods(table, ["mtgrpo", "grpo"])
    assert [m.name for m in chosen] == ["grpo", "mtgrpo_l0.25", "mtgrpo_l1"]
    # the held-out-signal method is ours, not the paper's: it runs when named
    assert "mtgrpo_val" not in [m.name for m in bench.select_methods(table, None)]
    assert [m.name for m in bench.select_methods(table, ["mtgrpo_val", "dapo"])] == [
        "dapo", "mtgrpo_val"]


def test_a_method_reading_the_validation_split_needs_one_in_the_base() -> None:
    table = bench.method_table((0.25,))
    with pytest.raises(ValueError, match=r"mtgrpo_val weight tasks by held-out validation "
                                         r"accuracy, but the base config has no validation "
                                         r"split \(tasks.validation_size is 0\); add --set "
                                         r"tasks.validation_size=50"):
        bench.check_validation_split([table["mtgrpo_val"]], {"tasks": {"validation_size": 0}})
    bench.check_validation_split([table["mtgrpo_val"]], {"tasks": {"validation_size": 8}})
    bench.check_validation_split([table["dapo"]], {})  # the others do not read it
    with pytest.raises(ValueError, match="unknown method 'grpp'; valid methods: grpo, dapo"):
        bench.select_methods(table, ["grpp"])


@pytest.mark.parametrize(("argv", "match"), [
    (["--seeds", "1,1"], "distinct integers"),
    (["--seeds", "one"], "comma-separated integers"),
    (["--lambdas", "0.25,-1"], "finite λ >= 0"),
    (["--lambdas", "0.3,0.3"], "repeats a value"),
    (["--set", "learning_rate"], "key=value"),
    (["--methods", "dapo,ppo"], "unknown method 'ppo'"),
    (["--thresholds", "50"], "fractions in"),
    (["--threads", "0"], "--threads must be >= 1"),
    (["--max-steps", "0"], "--max-steps must be a positive integer"),
    (["--jobs", "0"], "--jobs must be >= 1"),
    (["--jobs", "2", "--only", "grpo-seed1"], "drop --jobs"),
])
def test_bad_options_say_the_rule(argv: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        bench.parse_options(argv)


def test_a_config_without_evaluation_is_refused_before_any_work(tmp_path, capsys) -> None:
    config = write_config(tmp_path, "unused-model", eval_steps=0)
    code = bench.main(["--config", str(config), "--out", str(tmp_path / "grid")])
    assert code == 2
    assert "add --set eval_steps=N" in capsys.readouterr().err
    assert not (tmp_path / "grid").exists()


# ----------------------------------------------------------------------------- dry run


def test_dry_run_lists_every_run_with_its_overrides_and_trains_nothing(tmp_path, capsys) -> None:
    config = write_config(tmp_path, "unused-model")
    out = tmp_path / "grid"
    code = bench.main(["--config", str(config), "--out", str(out), "--dry-run",
                       "--methods", "grpo,mtgrpo", "--lambdas", "0.25", "--seeds", "1,2",
                       "--set", "learning_rate=0.01"])
    assert code == 0
    text = capsys.readouterr().out
    for label in ("grpo-seed1", "grpo-seed2", "mtgrpo_l0.25-seed1", "mtgrpo_l0.25-seed2"):
        assert f"{label}  " in text  # the label, padded before its state
    assert "{task_weighting: uniform, task_weighting_params: {}, batch_construction: iid" in text
    assert "[new]" in text
    assert "lam: 0.25" in text
    assert "seed: 2" in text
    assert f"start model: {out / 'warm_start' / 'sft' / 'model'}" in text
    assert "4 runs, 0 already done" in text
    assert not out.exists()


def test_runs_load_the_shared_warm_start_without_sft(tmp_path) -> None:
    config = write_config(tmp_path, "base-model", model={"name_or_path": "x", "tiny": True,
                                                         "tiny_options": {"hidden_size": 32}})
    plan = bench.plan_grid(bench.parse_options(["--config", str(config), "--out",
                                                str(tmp_path / "g"), "--max-steps", "5"]))
    assert plan.start.tiny_dir == tmp_path / "g" / "warm_start" / "base-model"
    for run in plan.runs:
        assert "sft" not in run.config
        assert run.config["model"]["name_or_path"] == str(
            tmp_path / "g" / "warm_start" / "sft" / "model")
        assert run.config["model"]["tiny"] is False
        assert run.config["max_steps"] == 5
        assert run.config["output_dir"] == str(tmp_path / "g" / run.label)


# ----------------------------------------------------------------------------- Δm% by seed


def _fake_run(run, accuracy: dict[str, float], max_steps: int) -> None:
    """A finished run directory: its config and a log with the final eval step."""
    run.run_dir.mkdir(parents=True)
    resolved = bench.written_config(run.config)
    (run.run_dir / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
    records = [{"step": step, "split": "train", "time/step": 1.0}
               for step in range(1, max_steps + 1)]
    records.append({"step": max_steps, "split": "eval",
                    **{f"tasks/{t}/accuracy": a for t, a in accuracy.items()}})
    (run.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_delta_m_pairs_every_run_with_dapo_of_the_same_seed(tmp_path) -> None:
    config = write_config(tmp_path, "unused-model")
    plan = bench.plan_grid(bench.parse_options(
        ["--config", str(config), "--out", str(tmp_path / "g"), "--methods", "grpo,dapo",
         "--seeds", "1,2"]))
    dapo = {1: {"countdown:easy": 0.2, "arc_1d:easy": 0.4},
            2: {"countdown:easy": 0.5, "arc_1d:easy": 0.25}}
    factor = {1: 1.1, 2: 0.8}  # grpo: +10 % on every task for seed 1, −20 % for seed 2
    for run in plan.runs:
        base = dapo[run.seed]
        accuracy = base if run.method.name == "dapo" else \
            {t: a * factor[run.seed] for t, a in base.items()}
        _fake_run(run, accuracy, plan.max_steps)
    comparison = bench.compare_grid(plan, (0.3,))
    assert comparison.aggregate.baseline == "dapo (same seed)"
    delta = {m.method: m.delta_m for m in comparison.aggregate.methods}
    # grpo: Δm% = +10 (seed 1) and −20 (seed 2): mean −5, sample std sqrt(450) = 21.21
    assert delta["grpo"].mean == pytest.approx(-5.0, abs=1e-9)
    assert delta["grpo"].std == pytest.approx(math.sqrt(450.0), abs=1e-9)
    assert (delta["dapo"].mean, delta["dapo"].std) == (0.0, 0.0)
    # the worst task: countdown for seeds 1 (0.2 < 0.4) and arc for seed 2 (0.25 < 0.5)
    table = bench.paper_table(comparison.aggregate, comparison.summaries)
    assert "| worst task (most often) |" in table
    assert "| countdown:easy (1/2) |" in table  # a tie goes to the suite's first task


# ----------------------------------------------------------------------------- verdict


def summary(label: str, worst: float, average: float, steps: dict[float, int | None],
            worst_task: str = "countdown:easy") -> RunSummary:
    """A hand-built run summary: only the numbers the verdict reads are meaningful."""
    return RunSummary(
        label=label, run_dir=None, method=None, split="eval", tasks=TASKS, last_step=100,
        final_step=100, final_accuracy={}, final_worst=worst, final_worst_task=worst_task,
        final_average=average, best_worst=worst, best_worst_step=100,
        best_worst_task=worst_task, best_average=average, best_average_step=100,
        steps_to_threshold=steps)


def _checks(runs: list[RunSummary], methods=("mtgrpo_l1",)):
    aggregate = aggregate_seeds(runs)
    return {(c.method, c.question.split(" (")[0]): c
            for c in bench.verdict(aggregate, runs, list(methods))}


def test_steps_by_majority_counts_never_as_infinite() -> None:
    # sorted [20, 40, inf]: two of three seeds had reached it by step 40
    assert bench.steps_by_majority([40, None, 20]) == 40
    assert bench.steps_by_majority([None, None, 10]) == math.inf
    assert bench.steps_by_majority([30, None]) == math.inf  # one of two is no majority
    assert bench.steps_by_majority([30, 10, 40, 20]) == 30  # three of four
    assert bench.steps_by_majority([7]) == 7
    assert bench.steps_by_majority([]) == math.inf


def test_verdict_when_mtgrpo_wins_everywhere() -> None:
    runs = [
        # mtgrpo worst mean 0.51, avg 0.60; dapo worst 0.52 (within 2 points), avg 0.62
        summary("mtgrpo_l1-seed1", 0.50, 0.60, {0.3: 20, 0.5: 60}),
        summary("mtgrpo_l1-seed2", 0.52, 0.60, {0.3: 30, 0.5: 80}),
        summary("grpo-seed1", 0.30, 0.50, {0.3: 90, 0.5: None}),
        summary("grpo-seed2", 0.28, 0.52, {0.3: None, 0.5: None}),
        summary("dapo-seed1", 0.52, 0.62, {0.3: 40, 0.5: None}),
        summary("dapo-seed2", 0.52, 0.62, {0.3: 50, 0.5: None}),
    ]
    checks = _checks(runs)
    assert checks["mtgrpo_l1", "Final worst-task accuracy above GRPO's"].answer is True
    above_grpo = checks["mtgrpo_l1", "Final worst-task accuracy above GRPO's"].evidence
    assert "the seed ranges do not overlap" in above_grpo
    # apart by means and ranges, but two seeds against two cannot reject: the best split of
    # the pooled four is one of C(4, 2) = 6, so the exact permutation p is 1/6
    assert "within the seed noise (one-sided, above grpo: Welch p = " in above_grpo
    assert above_grpo.endswith("permutation p = 0.17)")
    assert checks["mtgrpo_l1", "Final worst-task accuracy at least DAPO's"].answer is True
    # average 0.60 against the best 0.62: exactly 2 points below counts as within
    assert checks["mtgrpo_l1", "Final average accuracy within 2 points of the best method"
                  ].answer is True
    # 30 %: by majority mtgrpo step 30 (sorted [20, 30]), grpo never ([90, inf]), dapo 50
    at30 = checks["mtgrpo_l1", "Worst task at 30% in fewer steps than GRPO and DAPO"]
    assert at30.answer is True
    assert at30.evidence == ("step by which most seeds got there: mtgrpo_l1 step 30 (2/2 "
                             "reached), grpo never (1/2 reached), dapo step 50 (2/2 reached)")
    # 50 %: mtgrpo by step 80 ([60, 80]); neither baseline ever
    at50 = checks["mtgrpo_l1", "Worst task at 50% in fewer steps than GRPO and DAPO"]
    assert at50.answer is True


def test_verdict_says_no_when_mtgrpo_falls_short() -> None:
    runs = [
        summary("mtgrpo_l1-seed1", 0.40, 0.50, {0.3: 80}),
        summary("grpo-seed1", 0.45, 0.55, {0.3: 40}),
        summary("dapo-seed1", 0.425, 0.70, {0.3: 80}),  # 2.5 points above: not matched
    ]
    checks = _checks(runs)
    assert checks["mtgrpo_l1", "Final worst-task accuracy above GRPO's"].answer is False
    assert checks["mtgrpo_l1", "Final worst-task accuracy at least DAPO's"].answer is False
    average = checks["mtgrpo_l1", "Final average accuracy within 2 points of the best method"]
    assert average.answer is False
    assert "dapo's 70.0%: 20.0 points below" in average.evidence
    # a tie with DAPO (both step 80) is not "fewer steps"
    assert checks["mtgrpo_l1", "Worst task at 30% in fewer steps than GRPO and DAPO"
                  ].answer is False
    text = bench.render_verdict(list(checks.values()))
    assert "- Final worst-task accuracy above GRPO's? **No.** 40.0%" in text
    assert "seed noise" not in text  # one seed per method: no test across seeds


def test_verdict_says_whether_a_worst_task_gap_stands_outside_the_seed_noise() -> None:
    # four seeds each: MT-GRPO's worst task above GRPO's in every seed (permutation p =
    # 1 / C(8, 4) = 1/70), level with DAPO's (interleaved seeds)
    mt = [0.20, 0.21, 0.22, 0.23]
    runs = [summary(f"mtgrpo_l1-seed{i}", w, 0.5, {}) for i, w in enumerate(mt, 1)]
    runs += [summary(f"grpo-seed{i}", w, 0.5, {}) for i, w in enumerate(
        [0.10, 0.11, 0.12, 0.13], 1)]
    runs += [summary(f"dapo-seed{i}", w, 0.5, {}) for i, w in enumerate(
        [0.195, 0.215, 0.225, 0.235], 1)]
    checks = _checks(runs)
    grpo = checks["mtgrpo_l1", "Final worst-task accuracy above GRPO's"]
    assert grpo.answer is True
    assert "outside the seed noise" in grpo.evidence
    assert "permutation p = 0.01)" in grpo.evidence  # 1/70 = 0.014
    dapo = checks["mtgrpo_l1", "Final worst-task accuracy at least DAPO's"]
    # 21.5 % against 21.75 %: matched within 2 points by the means, and no evidence of more
    assert dapo.answer is True
    assert "within the seed noise (one-sided, above dapo" in dapo.evidence


def test_permutation_p_value_counts_the_splits_at_least_as_extreme() -> None:
    # pooled {1, 2, 3, 4}: six splits into two pairs; only {3, 4} vs {1, 2} has a gap of 2
    assert bench.permutation_p_value([3, 4], [1, 2]) == pytest.approx(1 / 6)
    # the smallest possible gap: every split is at least as extreme
    assert bench.permutation_p_value([1, 2], [3, 4]) == 1.0
    assert bench.permutation_p_value([1, 1], [1, 1]) == 1.0  # ties: no evidence
    # 5 vs 5 fully separated: 1 of C(10, 5) = 252 splits
    assert bench.permutation_p_value([6, 7, 8, 9, 10], [1, 2, 3, 4, 5]) == pytest.approx(1 / 252)


def test_welch_p_value_is_the_one_sided_welch_test() -> None:
    from scipy import stats

    mine, theirs = [0.10, 0.12, 0.14], [0.05, 0.06, 0.07]
    # by hand: sample variances 0.0004 and 0.0001, n = 3 each
    se2 = 0.0004 / 3 + 0.0001 / 3
    t = (0.12 - 0.06) / math.sqrt(se2)  # 4.648
    df = se2 ** 2 / ((0.0004 / 3) ** 2 / 2 + (0.0001 / 3) ** 2 / 2)  # 2.941 (Welch-Satterthwaite)
    assert t == pytest.approx(4.648, abs=1e-3)
    assert df == pytest.approx(2.941, abs=1e-3)
    assert bench.welch_p_value(mine, theirs) == pytest.approx(float(stats.t.sf(t, df)),
                                                              rel=1e-9)
    assert bench.welch_p_value(theirs, mine) == pytest.approx(1 - float(stats.t.sf(t, df)),
                                                              rel=1e-9)
    assert bench.welch_p_value([0.2, 0.2], [0.1, 0.1]) == 0.0  # constant, strictly above
    assert bench.welch_p_value([0.1, 0.1], [0.1, 0.1]) == 1.0
    # one constant group: t = (0.51 - 0.52) / sqrt(0.0002 / 2) = -1 on 1 degree of freedom, a
    # Cauchy variable: P(T > -1) = 1/2 + atan(1) / pi = 0.75, without scipy's warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert bench.welch_p_value([0.50, 0.52], [0.52, 0.52]) == pytest.approx(0.75, rel=1e-9)


def test_noise_checks_separate_a_clear_lead_from_overlapping_seeds() -> None:
    runs = [summary(f"mtgrpo_l1-seed{k}", w, 0.30, {}) for k, w in
            enumerate((0.20, 0.21, 0.22, 0.23, 0.24), 1)]
    runs += [summary(f"grpo-seed{k}", w, 0.34, {}) for k, w in
             enumerate((0.10, 0.11, 0.12, 0.13, 0.14), 1)]
    runs += [summary(f"dapo-seed{k}", w, 0.32, {}) for k, w in
             enumerate((0.15, 0.25, 0.20, 0.26, 0.18), 1)]
    group_of = aggregate_seeds(runs).group_of
    checks = {c.other: c for c in bench.noise_checks(runs, group_of, ["mtgrpo_l1"])}
    assert set(checks) == {"grpo", "dapo"}
    assert checks["grpo"].permutation_p == pytest.approx(1 / 252)
    assert checks["grpo"].outside_noise
    assert checks["grpo"].average_gap == pytest.approx(-0.04)
    assert not checks["dapo"].outside_noise  # means 0.22 vs 0.208 with seeds interleaved
    text = bench.render_noise(list(checks.values()), 0.015, 400)
    assert "1.5 points" in text
    assert "mtgrpo_l1 vs grpo: 22.0% against 12.0%" in text
    assert "**outside the noise**" in text
    assert "**within the noise**" in text
    # one seed of a method is not a sample: no check
    assert bench.noise_checks(runs[:6], aggregate_seeds(runs[:6]).group_of, ["mtgrpo_l1"]) == []


def test_evaluation_standard_error_is_the_largest_binomial_one() -> None:
    runs = [dataclasses_replace(summary("grpo-seed1", 0.1, 0.2, {}),
                                final_accuracy={"a": 0.1, "b": 0.5})]
    # sqrt(0.5 * 0.5 / 400) = 0.025 beats sqrt(0.1 * 0.9 / 400) = 0.015
    assert bench.evaluation_standard_error(runs, 400) == pytest.approx(0.025)
    assert math.isnan(bench.evaluation_standard_error(runs, 0))


def test_start_gain_counts_the_noise_of_both_ends() -> None:
    gain = bench.StartGain("m", "t", start=(0.1, 0.2), final=(0.3, 0.2), samples=100)
    # gain: mean final 0.25 − mean start 0.15; variance of the difference of the seed means:
    # (0.09 + 0.16 + 0.21 + 0.16) / 100 / 2² = 0.00155, so SE = 0.039370
    assert gain.gain == pytest.approx(0.10)
    assert gain.standard_error == pytest.approx(math.sqrt(0.00155))
    assert gain.z == pytest.approx(0.10 / math.sqrt(0.00155))
    level = bench.StartGain("m", "t", start=(0.0,), final=(0.0,), samples=100)
    assert (level.gain, level.standard_error, level.z) == (0.0, 0.0, 0.0)
    assert bench.StartGain("m", "t", (0.0,), (1.0,), 100).z == math.inf
    unknown = bench.StartGain("m", "t", (0.1,), (0.3,), samples=0)  # eval size not known
    assert math.isnan(unknown.standard_error)
    assert math.isnan(unknown.z)
    assert bench._finite_or_none(unknown.z) is None


def _eval_history(label: str, steps_and_accuracy: dict[int, dict[str, float]]) -> RunHistory:
    return RunHistory([{"step": step, "split": "eval",
                        **{f"tasks/{t}/accuracy": a for t, a in accuracy.items()}}
                       for step, accuracy in steps_and_accuracy.items()], name=label)


def test_start_gains_pair_step_zero_with_the_final_evaluation() -> None:
    histories = {
        "grpo-seed1": _eval_history("grpo-seed1", {0: {"a": 0.5, "b": 0.1},
                                                   10: {"a": 0.9, "b": 0.0},
                                                   20: {"a": 0.7, "b": 0.1}}),
        "grpo-seed2": _eval_history("grpo-seed2", {0: {"a": 0.3, "b": 0.1},
                                                   20: {"a": 0.5, "b": 0.2}}),
        # no evaluation at step 0: no start to measure a gain from
        "dapo-seed1": _eval_history("dapo-seed1", {10: {"a": 0.1}, 20: {"a": 0.2}}),
    }
    group_of = {"grpo-seed1": "grpo", "grpo-seed2": "grpo", "dapo-seed1": "dapo"}
    gains = {(g.method, g.task): g for g in bench.start_gains(histories, group_of, 400)}
    assert set(gains) == {("grpo", "a"), ("grpo", "b")}
    a = gains["grpo", "a"]
    assert (a.start, a.final, a.samples) == ((0.5, 0.3), (0.7, 0.5), 400)
    assert a.gain == pytest.approx(0.2)
    # (0.25 + 0.21 + 0.21 + 0.25) / 400 / 4 = 0.000575: SE 2.4 points, gain 8.3 SE
    text = bench.render_start_gains(list(gains.values()))
    assert "| grpo | a | 2 | 40.0% | 60.0% | +20.0 | +20.0, +20.0 | 2.4 | +8.3 | yes |" in text
    # b: +5 points; variance (0.09 + 0.09 + 0.09 + 0.16) / 400 / 4: SE 1.6 points, 3.0 SE
    b = gains["grpo", "b"]
    assert b.gain == pytest.approx(0.05)
    assert b.standard_error == pytest.approx(math.sqrt(0.43 / 1600))
    assert "| grpo | b | 2 | 10.0% | 15.0% | +5.0 | +0.0, +10.0 | 1.6 | +3.0 | yes |" in text
    assert "400 samples per task and evaluation" in text
    assert bench.render_start_gains([]) == ""


def _train_history(label: str, steps: list[dict[str, Any]]) -> RunHistory:
    return RunHistory([{"step": i, "split": "train", **record}
                       for i, record in enumerate(steps, start=1)], name=label)


def test_training_signal_sums_the_groups_each_task_trained_on() -> None:
    def step(groups, share_a, weight_a, zero_a, zero_b):
        return {"sampling/batch_groups": groups,
                "tasks/a/batch_share": share_a, "tasks/b/batch_share": 1 - share_a,
                "tasks/a/weight": weight_a, "tasks/b/weight": 1 - weight_a,
                "tasks/a/zero_gradient_rate": zero_a, "tasks/b/zero_gradient_rate": zero_b}

    histories = {
        # a: 6 × 0.5 + 4 × 0.25 = 4 groups, b: 3 + 3 = 6
        "m-seed1": _train_history("m-seed1", [step(6, 0.5, 0.6, 0.2, 0.4),
                                              step(4, 0.25, 0.8, 0.4, 0.0)]),
        # a: 8 × 0.5 = 4 groups, b: 4
        "m-seed2": _train_history("m-seed2", [step(8, 0.5, 0.5, 0.0, 1.0)]),
    }
    signal = {g.task: g for g in bench.training_signal(histories, dict.fromkeys(histories, "m"))}
    a, b = signal["a"], signal["b"]
    assert (a.method, a.runs, b.runs) == ("m", 2, 2)
    # run means, then the mean over runs: a's weight (0.7 + 0.5) / 2, share (0.375 + 0.5) / 2
    assert a.weight == pytest.approx(0.6)
    assert a.batch_share == pytest.approx(0.4375)
    assert b.batch_share == pytest.approx(0.5625)
    assert a.zero_gradient_rate == pytest.approx(0.15)
    assert b.zero_gradient_rate == pytest.approx(0.6)
    assert (a.groups_trained, b.groups_trained) == (pytest.approx(4.0), pytest.approx(5.0))
    text = bench.render_training_signal([a, b])
    assert "| m | a | 2 | 0.60 | 0.44 | 0.15 | 4 |" in text
    # a run that logged no weights (uniform weighting logs them too; an old log may not)
    bare = _train_history("u-seed1", [{"sampling/batch_groups": 4, "tasks/a/batch_share": 1.0}])
    [only] = bench.training_signal({"u-seed1": bare}, {"u-seed1": "u"})
    assert (only.weight, only.batch_share, only.groups_trained) == (None, 1.0, 4.0)
    assert only.zero_gradient_rate is None
    assert "| u | a | 1 | — | 1.00 | — | 4 |" in bench.render_training_signal([only])
    # a step without its group count is left out of the groups trained, not NaN
    gap = _train_history("g-seed1", [{"sampling/batch_groups": 4, "tasks/a/batch_share": 0.5},
                                     {"tasks/a/batch_share": 0.5}])
    [partial] = bench.training_signal({"g-seed1": gap}, {"g-seed1": "g"})
    assert partial.groups_trained == 2.0


def test_verdict_is_undecided_without_baselines_and_no_without_runs() -> None:
    runs = [summary("mtgrpo_l1-seed1", 0.4, 0.5, {0.3: 10})]
    checks = _checks(runs, methods=("mtgrpo_l1", "mtgrpo_l2"))
    assert checks["mtgrpo_l1", "Final worst-task accuracy above GRPO's"].answer is None
    assert checks["mtgrpo_l1", "Worst task at 30% in fewer steps than GRPO and DAPO"
                  ].answer is None
    missing = checks["mtgrpo_l2", "Finished with an eval accuracy for every task"]
    assert missing.answer is False
    assert "**Undecided.**" in bench.render_verdict(list(checks.values()))


# ----------------------------------------------------------------------------- smoke grid


def _drop_last_step(run_dir: Path, step: int) -> None:
    """Simulate a crash just before ``step`` was saved: no checkpoint, no records of it."""
    shutil.rmtree(run_dir / f"checkpoint-{step}")
    log = run_dir / "metrics.jsonl"
    kept = [line for line in log.read_text().splitlines() if json.loads(line)["step"] < step]
    log.write_text("".join(line + "\n" for line in kept))


def test_smoke_grid_trains_once_resumes_and_skips_finished_runs(tmp_path, tiny_model_dir,
                                                                capsys) -> None:
    out = tmp_path / "grid"
    argv = ["--config", str(write_config(tmp_path, tiny_model_dir)), "--out", str(out),
            "--methods", "grpo,mtgrpo", "--lambdas", "0.25", "--seeds", "1",
            "--thresholds", "0.1,0.2"]
    first = bench.run_grid(bench.parse_options(argv))
    assert (first.executed, first.skipped, first.failed) == (
        ["grpo-seed1", "mtgrpo_l0.25-seed1"], [], {})
    warm = out / "warm_start" / "sft" / "model"
    for label in first.executed:
        resolved = yaml.safe_load((out / label / "config.yaml").read_text())
        assert resolved["model"]["name_or_path"] == str(warm)
        assert "sft" not in resolved
        assert resolved["seed"] == 1
    text = (out / "results.md").read_text()
    for section in ("## Methods", "## Results (eval split)", "## Verdict", "## Per seed",
                    "**mtgrpo_l0.25**", "steps→10% (reached)", "worst task (most often)",
                    "### Gain over the start (step 0)"):
        assert section in text
    assert "Command: `python benchmarks/mtgrpo_vs_baselines.py --config" in text
    assert (out / "figures" / "compare_worst.png").is_file()
    written = json.loads((out / "results.json").read_text())
    assert written["verdict"]
    assert {(g["method"], g["task"]) for g in written["start_gains"]} == {
        (method, task) for method in ("grpo", "mtgrpo_l0.25") for task in TASKS}
    assert {(g["method"], g["task"]) for g in written["training_signal"]} == {
        (method, task) for method in ("grpo", "mtgrpo_l0.25") for task in TASKS}
    assert "### Training signal per task" in text

    second = bench.run_grid(bench.parse_options(argv))
    assert (second.executed, second.skipped) == ([], ["grpo-seed1", "mtgrpo_l0.25-seed1"])

    _drop_last_step(out / "grpo-seed1", 2)
    third = bench.run_grid(bench.parse_options(argv))
    assert (third.executed, third.skipped) == (["grpo-seed1"], ["mtgrpo_l0.25-seed1"])
    assert third.plan.runs[0].state.status == "resume"
    assert third.plan.runs[0].state.checkpoint == out / "grpo-seed1" / "checkpoint-1"
    assert (out / "grpo-seed1" / "checkpoint-2" / "trainer_state.json").is_file()

    changed = bench.main([*argv, "--set", "learning_rate=0.5"])
    assert changed == 2
    assert "was trained with a different config (learning_rate: 0.001 -> 0.5)" in \
        capsys.readouterr().err


def test_a_failing_run_is_recorded_and_the_grid_goes_on(tmp_path, monkeypatch, capsys) -> None:
    trained = []

    def fake_run(planned) -> None:
        if planned.method.name == "grpo":
            raise RuntimeError("out of memory")
        trained.append(planned.label)

    monkeypatch.setattr(bench, "prepare_start", lambda plan: None)
    monkeypatch.setattr(bench, "execute_run", fake_run)
    out = tmp_path / "grid"
    code = bench.main(["--config", str(write_config(tmp_path, "unused-model")), "--out", str(out),
                       "--methods", "grpo,dapo", "--seeds", "1,2"])
    assert code == 1
    assert trained == ["dapo-seed1", "dapo-seed2"]
    text = (out / "results.md").read_text()
    assert "Failed: `grpo-seed1` (RuntimeError: out of memory); `grpo-seed2`" in text
    assert "Not finished (left out of every table): dapo-seed1, dapo-seed2" in text
    assert "No run has finished" in text
    assert json.loads((out / "results.json").read_text())["failed"]["grpo-seed2"] == \
        "RuntimeError: out of memory"


# ----------------------------------------------------------------------------- --jobs


def test_worker_argv_reproduces_the_grid_for_one_run(tmp_path) -> None:
    options = bench.parse_options(
        ["--config", "quickstart", "--out", str(tmp_path / "g"), "--methods", "grpo,mtgrpo",
         "--seeds", "3,1", "--lambdas", "0.25,4", "--max-steps", "7", "--threads", "2",
         "--set", "eval_steps=5", "--set", "tasks.eval_size=9", "--jobs", "3"])
    argv = bench.worker_argv(options, "mtgrpo_l0.25-seed3")
    assert argv[:2] == [sys.executable, str(ROOT / "benchmarks" / "mtgrpo_vs_baselines.py")]
    child = bench.parse_options(argv[2:])
    assert child.only == "mtgrpo_l0.25-seed3"
    assert child.jobs == 1
    for name in ("config", "out", "methods", "seeds", "lambdas", "max_steps", "threads", "sets"):
        assert getattr(child, name) == getattr(options, name), name
    # the child plans the same runs with the same configs
    parent_plan, child_plan = bench.plan_grid(options), bench.plan_grid(child)
    assert [(r.label, r.config) for r in child_plan.runs] == \
        [(r.label, r.config) for r in parent_plan.runs]


# Each command marks that it started, waits (up to 60 s) until two have started, records when
# it ran and exits with the status it was given: the first two can only go on together.
_WORKER = """
import pathlib, sys, time
folder, label, status = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
start = time.time()
(folder / f"{label}.started").touch()
deadline = time.time() + 60
while len(list(folder.glob("*.started"))) < 2 and time.time() < deadline:
    time.sleep(0.01)
paired = len(list(folder.glob("*.started"))) >= 2
(folder / f"{label}.time").write_text(f"{start} {time.time()} {paired}")
print("done", label)
sys.exit(status)
"""


def test_run_parallel_keeps_at_most_jobs_running_and_reports_each_status(tmp_path,
                                                                         caplog) -> None:
    caplog.set_level(logging.INFO, logger=bench.logger.name)
    labels = ["a", "b", "c", "d", "e"]
    codes = {"a": 0, "b": 0, "c": 3, "d": 0, "e": 0}
    commands = {label: [sys.executable, "-c", _WORKER, str(tmp_path), label, str(codes[label])]
                for label in labels}
    logs = {label: tmp_path / "logs" / f"{label}.log" for label in labels}
    logs["a"].parent.mkdir()
    logs["a"].write_text("earlier output\n")  # appended to, not replaced
    statuses = bench.run_parallel(commands, logs, jobs=2, poll_seconds=0.02)
    assert statuses == codes
    records = [(tmp_path / f"{label}.time").read_text().split() for label in labels]
    assert records[0][2] == records[1][2] == "True"  # a and b ran side by side
    # never three at a time: a command starts only after another has ended
    spans = [(float(start), float(end)) for start, end, _ in records]
    assert max(sum(start <= t < end for start, end in spans) for t, _ in spans) <= 2
    assert logs["a"].read_text().startswith("earlier output\ndone a")
    assert "done c" in logs["c"].read_text()
    assert f"c: failed, exit status 3 (log {logs['c']})" in caplog.text


def test_stopping_workers_kills_one_that_ignores_sigterm(tmp_path) -> None:
    stubborn = subprocess.Popen([sys.executable, "-c",
                                 "import signal, time; signal.signal(signal.SIGTERM, "
                                 "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"],
                                stdout=subprocess.PIPE)
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert stubborn.stdout.readline() == b"ready\n"  # its handler is in place
    bench._stop([stubborn, polite], grace_seconds=0.5)
    assert stubborn.returncode == -signal.SIGKILL
    assert polite.returncode == -signal.SIGTERM
    assert bench._exit_text(stubborn.returncode) == "killed by SIGKILL"
    assert bench._exit_text(3) == "exit status 3"


def test_a_terminated_grid_stops_its_workers_and_says_how_to_resume(tmp_path, caplog) -> None:
    ready = tmp_path / "ready"
    worker = [sys.executable, "-c", "import os, pathlib, sys, time; "
              "pathlib.Path(sys.argv[1]).write_text(str(os.getpid())); time.sleep(60)", str(ready)]

    def terminate_when_the_worker_runs() -> None:
        deadline = time.monotonic() + 60
        while not ready.exists() or not ready.read_text():
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)  # a scheduler stopping the grid

    threading.Thread(target=terminate_when_the_worker_runs, daemon=True).start()
    caplog.set_level(logging.INFO, logger=bench.logger.name)
    with pytest.raises(SystemExit) as stopped:
        bench.run_parallel({"grpo-seed3": worker}, {"grpo-seed3": tmp_path / "w.log"}, jobs=1,
                           poll_seconds=0.02)
    assert stopped.value.code == 128 + signal.SIGTERM
    with pytest.raises(ProcessLookupError):  # stopped and reaped, not left sleeping
        os.kill(int(ready.read_text()), 0)
    assert "stopping grpo-seed3; the same command resumes each from its last checkpoint" in \
        caplog.text


def test_only_names_a_run_of_the_grid(tmp_path, capsys) -> None:
    code = bench.main(["--config", str(write_config(tmp_path, "unused-model")), "--out",
                       str(tmp_path / "g"), "--methods", "grpo", "--seeds", "1",
                       "--only", "dapo-seed1"])
    assert code == 2
    assert "--only 'dapo-seed1' is not a run of this grid; its runs: grpo-seed1" in \
        capsys.readouterr().err


def test_a_grid_with_two_jobs_trains_each_run_in_a_process_of_its_own(tmp_path,
                                                                     tiny_model_dir) -> None:
    out = tmp_path / "grid"
    argv = ["--config", str(write_config(tmp_path, tiny_model_dir)), "--out", str(out),
            "--methods", "grpo,dapo", "--seeds", "1", "--jobs", "2"]
    result = bench.run_grid(bench.parse_options(argv))
    assert (sorted(result.executed), result.failed) == (["dapo-seed1", "grpo-seed1"], {})
    for label in ("grpo-seed1", "dapo-seed1"):
        assert (out / label / "checkpoint-2" / "trainer_state.json").is_file()
        log = (out / "logs" / f"{label}.log").read_text()
        assert f"{label}: training" in log  # the worker's own log
    text = (out / "results.md").read_text()
    assert "Runs: 2 of 2 finished (2 trained by this invocation" in text
    # a second invocation finds both done and starts no process
    again = bench.run_grid(bench.parse_options(argv))
    assert (again.executed, again.skipped) == ([], ["grpo-seed1", "dapo-seed1"])


def test_a_worker_that_fails_is_recorded_with_its_last_log_line(tmp_path, monkeypatch) -> None:
    def fake_parallel(commands, logs, jobs):
        assert jobs == 2
        for label, argv in commands.items():
            assert argv[argv.index("--only") + 1] == label
        with logs["grpo-seed1"].open("a") as log:
            log.write("loading\nRuntimeError: out of memory\n")
        return {"grpo-seed1": 1, "dapo-seed1": -signal.SIGKILL}  # dapo: killed, no output

    monkeypatch.setattr(bench, "prepare_start", lambda plan: None)
    monkeypatch.setattr(bench, "run_parallel", fake_parallel)
    out = tmp_path / "grid"
    logs = out / "logs"
    logs.mkdir(parents=True)  # an earlier invocation's output, which is not this one's error
    for label in ("grpo-seed1", "dapo-seed1"):
        (logs / f"{label}.log").write_text("ValueError: an earlier failure\n")
    result = bench.run_grid(bench.parse_options(
        ["--config", str(write_config(tmp_path, "unused-model")), "--out", str(out),
         "--methods", "grpo,dapo", "--seeds", "1", "--jobs", "2"]))
    assert result.executed == []
    assert result.failed == {
        "grpo-seed1": "exit status 1: RuntimeError: out of memory "
                      f"(log: {logs / 'grpo-seed1.log'})",
        "dapo-seed1": f"killed by SIGKILL: (no output) (log: {logs / 'dapo-seed1.log'})"}
    assert "Failed: `grpo-seed1` (exit status 1: RuntimeError: out of memory" in \
        (out / "results.md").read_text()
