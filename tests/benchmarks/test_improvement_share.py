"""``benchmarks/improvement_share.py``: MT-GRPO's weighting replayed from a run's log, checked
against the strategy that wrote a hand-built log, the weights it logged, and bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml

from mtgrpo.algo.weighting import TaskStats, make_weighting
from mtgrpo.reporting.metrics import MetricsWriter
from script_loader import load_script

bench = load_script("benchmarks/improvement_share.py")
TASKS = ("easy", "hard", "middle")


def _write_run(run, *, steps=12, lam=0.5, params=None, resume_at=None, seed=0, skip_at=None,
               terms=None):
    """A run directory whose log a real MT-GRPO strategy wrote through the trainer's
    ``MetricsWriter``: the weights each step used, the batch accuracy J, the improvement I
    (some tasks absent or unmeasured; none at all at ``skip_at``, an update that was skipped)
    and the share the strategy reported. At ``resume_at`` the step is first logged with other
    weights (an interrupted attempt) and then again, as a resumed run does, with a ``log()``
    record (no task keys) between. Returns the reported shares by step; ``terms`` (a dict)
    receives each step's ``last_terms`` (``(I, λJ, z)``; None for an update that observed
    nothing)."""
    run.mkdir(parents=True)
    params = {"lam": lam, **(params or {})}
    (run / "config.yaml").write_text(yaml.safe_dump(
        {"task_weighting": "mt_grpo", "task_weighting_params": params, "num_generations": 4}))
    rng = np.random.default_rng(seed)
    strategy = make_weighting("mt_grpo", 3, task_names=list(TASKS), **params)
    shares = {}
    with MetricsWriter(run / "metrics.jsonl") as writer:
        for step in range(1, steps + 1):
            groups = rng.integers(0, 4, size=3)  # 0: the task was absent this step
            accuracy = np.where(groups > 0, np.array([0.8, 0.1, 0.5]) + rng.normal(0, 0.05, 3),
                                math.nan)
            improvement = np.where(groups > 0, rng.normal(0, 0.01, 3), math.nan)
            improvement[rng.random(3) < 0.1] = math.nan  # present but not measured
            if step == skip_at:
                improvement[:] = math.nan
            record = {"step": step, "split": "train"}
            for k, task in enumerate(TASKS):
                record[f"tasks/{task}/weight"] = float(strategy.weights[k])
                record[f"tasks/{task}/groups_generated"] = int(groups[k])
                record[f"tasks/{task}/accuracy"] = float(accuracy[k])  # NaN: absent
                record[f"tasks/{task}/improvement"] = float(improvement[k])
            if step == resume_at:
                writer.write({**record, "tasks/easy/weight": 0.9, "tasks/hard/weight": 0.05})
                writer.write({"step": step, "split": "eval", "accuracy/worst": 0.1})
            strategy.update(TaskStats(accuracy, groups * 4, improvement))
            shares[step] = strategy.diagnostics().get("weighting/improvement_share", math.nan)
            if terms is not None:
                terms[step] = strategy.last_terms
            writer.write(record)
            if step == resume_at:
                writer.write({"step": step, "split": "train", "custom": 1.0})  # trainer.log()
    return shares


def test_the_replay_reproduces_the_strategy_that_wrote_the_log(tmp_path):
    shares = _write_run(tmp_path / "run", resume_at=5, skip_at=8,
                        params={"improvement_clip": 0.004, "reward_ema": 0.5})
    replay = bench.replay(tmp_path / "run")
    assert replay.tasks == list(TASKS)
    assert replay.steps.tolist() == list(range(1, 13))  # the re-logged step counted once
    assert replay.max_weight_error == 0.0  # the attempt's other weights at step 5 dropped
    assert replay.params == {**make_weighting("mt_grpo", 3).params, "lam": 0.5,
                             "improvement_clip": 0.004, "reward_ema": 0.5}
    expected = np.array([shares[s] for s in range(1, 13)])
    assert math.isnan(expected[7])  # the skipped update: no I, no share (not 0)
    np.testing.assert_array_equal(np.isnan(replay.shares), np.isnan(expected))
    np.testing.assert_allclose(replay.shares[~np.isnan(expected)], expected[~np.isnan(expected)],
                               rtol=0, atol=0)
    assert ((replay.shares > 0) & (replay.shares < 1)).sum() >= 6  # the data is not degenerate
    # the sizes behind the share: I clipped to 0.004 centres to at most 0.008 per task
    assert np.nanmax(replay.improvement_size) <= 0.008
    # a step where no task was present updates nothing: no sizes, no share
    no_update = np.isnan(replay.reward_size)
    np.testing.assert_array_equal(np.isnan(replay.improvement_size), no_update)
    assert np.isnan(replay.shares[no_update]).all()
    assert (replay.reward_size[~no_update] > 0).all()
    both = replay.improvement_size + replay.reward_size
    measured = ~np.isnan(expected)
    np.testing.assert_allclose(replay.shares[measured], (replay.improvement_size / both)[measured],
                               rtol=1e-15)
    assert replay.improvement_size[7] == 0.0


def _loop_parts(improvement, reward, weights):
    """A loop reference for the two parts of g over the tasks with a J (centred on their own
    z-weighted mean, times their z; 0 for the others; an unmeasured I counts 0):
    part_k = z_k (t_k − Σ_seen z_j t_j / Σ_seen z_j)."""
    seen = [math.isfinite(r) for r in reward]
    total = sum(w for w, s in zip(weights, seen, strict=True) if s)
    parts = []
    for term in (improvement, reward):
        t = [v if s and math.isfinite(v) else 0.0 for v, s in zip(term, seen, strict=True)]
        mean = sum(w * v for w, v, s in zip(weights, t, seen, strict=True) if s) / total
        parts.append([w * (v - mean) if s else 0.0
                      for w, v, s in zip(weights, t, seen, strict=True)])
    return parts


# seed 0 has a step where no task is present (no update: NaN rows); seed 3 a first step where
# a task is not yet observed (its part 0, the others centred on their own weighted mean)
@pytest.mark.parametrize("seed", [0, 3])
def test_which_way_each_term_pushed_each_task(tmp_path, capsys, seed):
    terms = {}
    _write_run(tmp_path / "run", skip_at=8, params={"improvement_clip": 0.004}, terms=terms,
               seed=seed)
    replay = bench.replay(tmp_path / "run")
    assert any(terms[s] is None for s in terms) == (seed == 0)
    assert (seed == 3) == (terms[1] is not None and not np.isfinite(terms[1][1]).all())
    eps = np.finfo(np.float64).eps
    for i, step in enumerate(replay.steps):
        if terms[step] is None:  # nothing observed: no update, no push
            assert np.isnan(replay.improvement_push[i]).all()
            assert np.isnan(replay.reward_push[i]).all()
            continue
        part_i, part_j = _loop_parts(*terms[step])
        # the push is −g's part (the update steps against g), within a few roundings of it
        np.testing.assert_allclose(replay.improvement_push[i], [-v for v in part_i], rtol=0,
                                   atol=8 * eps * 0.004)
        np.testing.assert_allclose(replay.reward_push[i], [-v for v in part_j], rtol=0,
                                   atol=8 * eps)
        # the parts sum over the tasks to 0 (centred) and their sizes are the sizes reported
        assert abs(replay.reward_push[i].sum()) <= 8 * eps
        assert abs(np.abs(replay.reward_push[i]).sum() - replay.reward_size[i]) <= 8 * eps
    assert (replay.improvement_push[7] == 0.0).all()  # the skipped update: I counts 0
    # J alone pushes the low-accuracy task up and the high-accuracy one down
    assert np.nanmean(replay.reward_push[:, 1]) > 0 > np.nanmean(replay.reward_push[:, 0])
    text = bench.main([str(tmp_path / "run")])
    capsys.readouterr()
    for k, task in enumerate(TASKS):
        pushes = (replay.improvement_push[:, k], replay.reward_push[:, k])
        means = [p[np.isfinite(p)].mean() for p in pushes]
        assert f"| {replay.weights[:, k].mean():.2f} | {means[0]:+.1e} | {means[1]:+.1e} |" \
            in text, task


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
    assert capsys.readouterr().out == text + "\n"


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
    # a run logged every other step: the replay would miss updates
    _write_run(tmp_path / "sparse", steps=6)
    log = tmp_path / "sparse" / "metrics.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join(line for line in lines
                             if json.loads(line)["step"] % 2 == 0) + "\n")
    with pytest.raises(ValueError, match=r"steps \[1, 3, 5\] are not in metrics.jsonl \(3 of 6 "
                       r"logged\).*logging_steps 1"):
        bench.replay(tmp_path / "sparse")
    # a log that is not the config's run: the replayed weights part from the logged ones
    _write_run(tmp_path / "other", lam=0.5)
    config = tmp_path / "other" / "config.yaml"
    config.write_text(config.read_text().replace("lam: 0.5", "lam: 3.0"))
    with pytest.raises(ValueError, match=r"differ from the logged .* at step 2"):
        bench.replay(tmp_path / "other")
