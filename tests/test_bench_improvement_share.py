"""``benchmarks/improvement_share.py``: MT-GRPO's weighting replayed from a run's log, checked
against the strategy that wrote a hand-built log, the weights it logged, and bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml

from mtgrpo.weighting import TaskStats, make_weighting
from script_loader import load_script

bench = load_script("benchmarks/improvement_share.py")
TASKS = ("easy", "hard", "middle")


def _write_run(run, *, steps=12, lam=0.5, params=None, resume_at=None, seed=0):
    """A run directory whose log a real MT-GRPO strategy wrote: the weights each step used,
    the batch accuracy J, the improvement I (some tasks absent or unmeasured) and the share the
    strategy reported. Returns the reported shares by step."""
    run.mkdir(parents=True)
    params = {"lam": lam, **(params or {})}
    (run / "config.yaml").write_text(yaml.safe_dump(
        {"task_weighting": "mt_grpo", "task_weighting_params": params, "num_generations": 4}))
    rng = np.random.default_rng(seed)
    strategy = make_weighting("mt_grpo", 3, task_names=list(TASKS), **params)
    records, shares = [], {}
    for step in range(1, steps + 1):
        groups = rng.integers(0, 4, size=3)  # 0: the task was absent this step
        accuracy = np.where(groups > 0, np.array([0.8, 0.1, 0.5]) + rng.normal(0, 0.05, 3),
                            math.nan)
        improvement = np.where(groups > 0, rng.normal(0, 0.01, 3), math.nan)
        improvement[rng.random(3) < 0.1] = math.nan  # present but not measured
        record = {"step": step, "split": "train"}
        for k, task in enumerate(TASKS):
            record[f"tasks/{task}/weight"] = float(strategy.weights[k])
            record[f"tasks/{task}/groups_generated"] = int(groups[k])
            if groups[k]:
                record[f"tasks/{task}/accuracy"] = float(accuracy[k])
                record[f"tasks/{task}/improvement"] = float(improvement[k])
        strategy.update(TaskStats(accuracy, groups * 4, improvement))
        shares[step] = strategy.diagnostics().get("weighting/improvement_share", math.nan)
        records.append(record)
        if step == resume_at:  # a resumed run logs eval records and re-logs this step
            records.append({"step": step, "split": "eval", "accuracy/worst": 0.1})
            records.append(dict(record))
    with open(run / "metrics.jsonl", "w") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    return shares


def test_the_replay_reproduces_the_strategy_that_wrote_the_log(tmp_path):
    shares = _write_run(tmp_path / "run", resume_at=5,
                        params={"improvement_clip": 0.004, "reward_ema": 0.5})
    replay = bench.replay(tmp_path / "run")
    assert replay.tasks == list(TASKS)
    assert replay.steps.tolist() == list(range(1, 13))  # the re-logged step counted once
    assert replay.max_weight_error == 0.0
    expected = np.array([shares[s] for s in range(1, 13)])
    np.testing.assert_array_equal(np.isnan(replay.shares), np.isnan(expected))
    np.testing.assert_allclose(replay.shares[~np.isnan(expected)], expected[~np.isnan(expected)],
                               rtol=0, atol=0)
    assert ((replay.shares > 0) & (replay.shares < 1)).sum() >= 8
    # the sizes behind the share: I clipped to 0.004 centres to at most 0.008 per task
    assert (replay.improvement_size <= 0.008).all()
    assert (replay.reward_size > 0).all()
    both = replay.improvement_size + replay.reward_size
    np.testing.assert_allclose(replay.shares, replay.improvement_size / both, rtol=1e-15)


def test_the_report_and_out(tmp_path, capsys):
    _write_run(tmp_path / "mtgrpo_l0.5-seed1")
    _write_run(tmp_path / "mtgrpo_l2-seed1", lam=2.0, seed=1)
    out = tmp_path / "report.md"
    out.write_text("kept\n")
    text = bench.main([str(tmp_path / "mtgrpo_l0.5-seed1"), str(tmp_path / "mtgrpo_l2-seed1"),
                       "--out", str(out)])
    assert out.read_text() == "kept\n" + text + "\n"
    assert "| mtgrpo_l2-seed1 | 2.0 | 12 |" in text
    replay = bench.replay(tmp_path / "mtgrpo_l2-seed1")
    shares = replay.shares[np.isfinite(replay.shares)]
    assert (f"| {shares.mean():.3f} / {np.median(shares):.3f} / {shares.max():.3f} |"
            in text)
    # the weights table: the last step's weights and the mean over the steps
    assert f"| mtgrpo_l2-seed1 | hard | {replay.weights[2, 1]:.2f} / {replay.weights[5, 1]:.2f}" \
           f" / {replay.weights[-1, 1]:.2f} | {replay.weights[:, 1].mean():.2f} |" in text
    capsys.readouterr()


def test_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no config\.yaml"):
        bench.replay(tmp_path)
    (tmp_path / "sec").mkdir()
    (tmp_path / "sec" / "config.yaml").write_text("task_weighting: sec\n")
    with pytest.raises(ValueError, match="task_weighting is 'sec', not mt_grpo"):
        bench.replay(tmp_path / "sec")
    _write_run(tmp_path / "run")
    (tmp_path / "run" / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="no training step"):
        bench.replay(tmp_path / "run")
    # a log that is not the config's run: the replayed weights part from the logged ones
    _write_run(tmp_path / "other", lam=0.5)
    config = tmp_path / "other" / "config.yaml"
    config.write_text(config.read_text().replace("lam: 0.5", "lam: 3.0"))
    with pytest.raises(ValueError, match=r"differ from the logged .* at step 2"):
        bench.replay(tmp_path / "other")
