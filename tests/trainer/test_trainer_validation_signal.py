"""Task weights read from held-out accuracy (``task_weighting_signal: validation``) on the tiny
model: the weights follow the validation split's accuracies by the strategy's formula, the
held-out accuracies are logged, and a run without a validation split is refused before any
model loads."""

from __future__ import annotations

import numpy as np
import pytest
import trainer_helpers as _common

from mtgrpo import GRPOTrainer
from mtgrpo.algo.weighting import softmax
from mtgrpo.compat import GRPOConfig
from mtgrpo.config import run_config_from_dict
from mtgrpo.reporting import read_metrics


def scripted_reward(prompts, completions, score, **kwargs):
    """Each row's own ``score`` column, whatever the completion: accuracies set by the data."""
    return [float(s) for s in score]


def _scored(rows, scores):
    return [{**row, "score": scores[row["task"]]} for row in rows]


def test_weights_follow_the_validation_accuracies(tiny_model_dir, tmp_path):
    # the training batch says beta is solved and alpha fails; the held-out split the reverse
    train = _scored(_common.rows(4), {"alpha": 0.0, "beta": 1.0})
    held_out = _scored(_common.validation_rows(2), {"alpha": 1.0, "beta": 0.0})
    args = _common.args(tmp_path, max_steps=3, task_weighting="worst_case",
                        task_weighting_signal="validation", validation_steps=2,
                        num_generations_validation=2, eval_temperature=1.0)
    trainer = GRPOTrainer(str(tiny_model_dir), scripted_reward, args=args,
                          train_dataset=train, validation_dataset=held_out)
    trainer.train()

    records = read_metrics(tmp_path, split="train")
    assert [r["step"] for r in records] == [1, 2, 3]
    # evaluated at the start of steps 1 and 3 (after 0 and 2 steps); every step reads the last
    assert [r["weighting/validation_step"] for r in records] == [0, 0, 2]
    assert ["time/validation" in r for r in records] == [True, False, True]
    for record in records:
        assert record["validation/alpha/accuracy"] == 1.0
        assert record["validation/beta/accuracy"] == 0.0
        assert "tasks/alpha/improvement" not in record  # worst_case reads no I_k
    # the batch says the reverse (None: no rollout of the task this step)
    assert {r["tasks/alpha/accuracy"] for r in records} <= {0.0, None}
    assert {r["tasks/beta/accuracy"] for r in records} <= {1.0, None}
    (run,) = read_metrics(tmp_path, split="run")
    assert run["weighting/signal"] == "validation"

    # worst_case from J = (1, 0) at every step: ξ ← ξ − β z (J − z·J), β = 0.5
    accuracy, logits, expected = np.array([1.0, 0.0]), np.zeros(2), []
    for _ in range(3):
        z = softmax(logits)
        expected.append(z)
        logits = logits - 0.5 * z * (accuracy - z @ accuracy)
    used = [[r["tasks/alpha/weight"], r["tasks/beta/weight"]] for r in records]
    np.testing.assert_allclose(used, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(trainer.weighting.weights, softmax(logits), rtol=0, atol=1e-12)
    assert trainer.weighting.weights[1] > 0.6  # the task failing held-out problems gains


def test_mt_grpo_reads_the_change_between_validation_evaluations(tiny_model_dir, tmp_path):
    train = _scored(_common.rows(4), {"alpha": 1.0, "beta": 1.0})
    held_out = _scored(_common.validation_rows(2), {"alpha": 1.0, "beta": 0.0})
    args = _common.args(tmp_path, max_steps=2, task_weighting="mt_grpo",
                        task_weighting_params={"lam": 0.5, "damping": 0.0},
                        task_weighting_signal="validation", validation_steps=1,
                        num_generations_validation=1)
    trainer = GRPOTrainer(str(tiny_model_dir), scripted_reward, args=args,
                          train_dataset=train, validation_dataset=held_out)
    assert not trainer.needs_improvement  # no I_k measured across the update
    trainer.train()
    records = read_metrics(tmp_path, split="train")
    # the first evaluation has no predecessor (I not measured); the second changed nothing
    assert [r["tasks/beta/improvement"] for r in records] == [None, 0.0]
    assert [r["weighting/validation_step"] for r in records] == [0, 1]
    logits = np.zeros(2)
    for _ in range(2):
        z = softmax(logits)
        s = 0.5 * np.array([1.0, 0.0])  # I = 0 (or not measured) + λ J
        logits = logits - 0.5 * z * (s - z @ s)
    np.testing.assert_allclose(trainer.weighting.weights, softmax(logits), rtol=0, atol=1e-12)


def test_no_validation_split_is_refused_before_the_model_loads(tmp_path):
    args = _common.args(tmp_path, task_weighting="mt_grpo", task_weighting_signal="validation")
    # the model path does not exist: the refusal must come first
    with pytest.raises(ValueError, match=r"task_weighting_signal='validation' weights the tasks "
                                         r"by their accuracy on a held-out validation split, "
                                         r"but this run has none. Fix: set "
                                         r"tasks.validation_size"):
        GRPOTrainer(str(tmp_path / "no-model"), [_common.alpha_reward, _common.beta_reward],
                    args=args, train_dataset=_common.rows())
    only_alpha = [row for row in _common.validation_rows() if row["task"] == "alpha"]
    with pytest.raises(ValueError, match=r"lacks \['beta'\] and has \[\] besides"):
        GRPOTrainer(str(tmp_path / "no-model"), [_common.alpha_reward, _common.beta_reward],
                    args=args, train_dataset=_common.rows(), validation_dataset=only_alpha)


def test_run_files_need_a_validation_split():
    with pytest.raises(ValueError, match=r"but this run has no tasks section. Fix: set "
                                         r"tasks.validation_size \(e.g. 50 problems per task\)"):
        run_config_from_dict({"task_weighting": "mt_grpo",
                              "task_weighting_signal": "validation"})
    tasks = {"tasks": ["countdown:easy", "arc_1d:easy"]}
    with pytest.raises(ValueError, match=r"but tasks.validation_size is 0"):
        run_config_from_dict({"task_weighting": "mt_grpo", "task_weighting_signal": "validation",
                              "tasks": tasks})
    run = run_config_from_dict({"task_weighting": "mt_grpo", "task_weighting_signal": "validation",
                                "tasks": {**tasks, "validation_size": 8}})
    assert run.training.multitask.task_weighting_signal == "validation"


@pytest.mark.parametrize(("options", "match"), [
    ({"task_weighting_signal": "held_out"}, "task_weighting_signal='held_out' is not one of: "
                                            "train, validation"),
    ({"task_weighting_signal": "validation"}, "task_weighting='uniform' never moves them"),
    ({"task_weighting": "sec", "task_weighting_signal": "validation",
      "num_generations_validation": 1}, "sec reads the mean |A|"),
    ({"validation_steps": 2.5}, "validation_steps=2.5 must be a whole number"),
    ({"validation_steps": 0}, "validation_steps=0 must be"),
    ({"num_generations_validation": 0}, "num_generations_validation=0 must be a positive"),
])
def test_signal_options_say_the_rule(options, match):
    with pytest.raises(ValueError, match=match.replace("|", r"\|")):
        GRPOConfig(**options)


def test_validation_steps_default_to_the_eval_interval():
    assert GRPOConfig(eval_steps=5).resolved_validation_steps(100) == 5
    assert GRPOConfig().resolved_validation_steps(100) == 10
    assert GRPOConfig(validation_steps=0.25).resolved_validation_steps(100) == 25
    assert GRPOConfig(num_generations=4).resolved_num_generations_validation == 4
    assert GRPOConfig(num_generations_validation=8).resolved_num_generations_validation == 8


def test_the_run_file_hands_the_suite_validation_split_to_the_trainer(monkeypatch):
    import mtgrpo.trainer as trainer_package
    from mtgrpo.trainer.run import build_trainer

    seen = {}

    def recorder(model, rewards, **kwargs):
        seen.update(kwargs)
        return "trainer"

    class Suite:
        eval, validation = ["eval rows"], ["validation rows"]

    monkeypatch.setattr(trainer_package, "GRPOTrainer", recorder)
    run = run_config_from_dict({"task_weighting": "mt_grpo", "task_weighting_signal": "validation",
                                "tasks": {"tasks": ["countdown:easy"], "validation_size": 4}})
    assert build_trainer(run, "model", "rewards", "train", Suite()) == "trainer"
    assert seen["validation_dataset"] == ["validation rows"]
    assert seen["eval_dataset"] == ["eval rows"]
    build_trainer(run_config_from_dict({}), "model", "rewards", "train")
    assert seen["validation_dataset"] is None
