"""An evaluation tells a task learned without solving it: the share of completions giving one
answer, the accuracy of always giving the commonest gold answer, and the warnings built on them
(``mtgrpo.evaluation.answer_concentration`` / ``answer_warnings``)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from mtgrpo.evaluation import (
    EvaluationResult,
    TaskResult,
    answer_concentration,
    answer_warnings,
    evaluate_prompts,
)


class _Rows:
    def __init__(self, rows):
        self.rows = rows

    def row(self, index):
        return self.rows[index]


def _group(prompt_id, task, *completions):
    return SimpleNamespace(prompt_id=prompt_id, task=task,
                           payload=SimpleNamespace(completions=list(completions)))


def test_concentration_counts_answers_per_task_in_each_rows_format():
    tag = json.dumps({"answer_format": "answer_tag"})
    rows = [
        # task 0: gold answers 1, 1, 1, 2 (answer_tag; the last row has no metadata: default)
        {"answer": "1", "metadata": tag}, {"answer": 1, "metadata": {"answer_format": "tag"}},
        {"answer": " 1 ", "metadata": tag}, {"answer": "2"},
        # task 1: boxed answers, gold 7 and 8
        {"answer": "7", "metadata": {"answer_format": "boxed"}},
        {"answer": "8", "metadata": {"answer_format": "boxed"}},
        # task 2: a format of the user's own (no answer read) and no gold answer on one row
        {"answer": "x", "metadata": {"answer_format": "mine"}}, {"metadata": "not json"},
    ]
    groups = [
        _group(0, 0, "<answer>1</answer>", "<answer> 1 </answer>"),
        _group(1, 0, "<answer>1</answer>", "I think 2"),  # the second gives no answer
        _group(2, 0, "<answer>1</answer>", "<answer>1</answer>"),
        _group(3, 0, "<answer>1</answer>", "<answer>2</answer>"),
        _group(4, 1, r"\boxed{7}", r"so \boxed{8}"),
        _group(5, 1, r"\boxed{8}", "<answer>8</answer>"),  # a tag is not a box
        _group(6, 2, "<answer>x</answer>"),
        _group(7, 2, "<answer>y</answer>"),
        SimpleNamespace(prompt_id=0, task=0, payload=None),  # nothing to read: skipped
    ]
    out = answer_concentration(_Rows(rows), groups)
    # task 0: "1" in 6 of 8 completions; gold "1" on 3 of 4 prompts
    assert out[0] == {"top_answer": "1", "top_answer_share": 6 / 8, "top_answer_gold_share": 3 / 4,
                      "baseline_answer": "1", "constant_baseline": 3 / 4}
    # task 1: "8" twice in 4 completions (the tag is not read in a boxed row); gold 7 and 8
    # tie, and the tie goes to the answer the completions give
    assert out[1] == {"top_answer": "8", "top_answer_share": 2 / 4, "top_answer_gold_share": 1 / 2,
                      "baseline_answer": "8", "constant_baseline": 1 / 2}
    # task 2: only row 7's "y" read (default format); one prompt lacks a gold answer
    assert (out[2]["top_answer"], out[2]["top_answer_share"], out[2]["baseline_answer"]) == \
        ("y", 1 / 2, None)
    assert math.isnan(out[2]["constant_baseline"])
    assert math.isnan(out[2]["top_answer_gold_share"])
    # no answer anywhere: share NaN, answer None
    none = answer_concentration(_Rows([{"answer": "3"}]), [_group(0, 0, "no tags")])
    assert none[0]["top_answer"] is None
    assert math.isnan(none[0]["top_answer_share"])


def _result(**fields):
    base = {"task": "t", "prompts": 100, "samples": 1, "accuracy": 0.3, "mean_reward": 0.3,
            "format_rate": 1.0, "mean_length": 9.0, "top_answer": "1", "top_answer_share": 0.3,
            "constant_baseline": 0.1, "baseline_answer": "1"}
    base.update(fields)
    if "top_answer_gold_share" not in fields:  # the top answer is the commonest gold one
        base["top_answer_gold_share"] = base["constant_baseline"]
    return EvaluationResult({"t": TaskResult(**base)})


def test_warnings_name_a_collapse_and_an_accuracy_at_the_constant_floor():
    # the measured case: 98 % answer "1", 59 % of gold answers are "1", accuracy 57 %
    collapsed = _result(accuracy=0.57, top_answer_share=0.98, constant_baseline=0.59)
    kinds = {kind: message for _, kind, message in answer_warnings(collapsed)}
    assert set(kinds) == {"collapse", "floor"}
    assert "98.0 % of the completions answer '1'" in kinds["collapse"]
    assert "59.0 % of its problems have that answer" in kinds["collapse"]
    assert "accuracy 57.0 % is no better than always answering '1'" in kinds["floor"]
    # the collapse needs 0.8 of the completions and 0.2 above the gold share
    assert answer_warnings(_result(top_answer_share=0.79)) == []
    assert [k for _, k, _ in answer_warnings(_result(top_answer_share=0.8))] == ["collapse"]
    assert answer_warnings(_result(top_answer_share=0.85, constant_baseline=0.7,
                                   accuracy=0.9)) == []
    # the margin is over the gold share of the answer given, not of the commonest gold answer
    other = _result(top_answer="0", top_answer_share=0.9, constant_baseline=0.75,
                    top_answer_gold_share=0.05, accuracy=0.9)
    assert [m for _, _, m in answer_warnings(other)] == [
        "t: 90.0 % of the completions answer '0' and 5.0 % of its problems have that answer: "
        "the policy has collapsed onto one answer; the reward is earned without solving the "
        "task (use problems whose answers vary more, or lower the task's weight)"]
    # the floor: accuracy within 2 SE of a constant scoring >= 0.2, SE of prompts x samples
    b = 0.5
    edge = b + 2 * math.sqrt(b * (1 - b) / 400)  # 0.55
    at = _result(samples=4, accuracy=edge - 1e-9, constant_baseline=b)
    assert [k for _, k, _ in answer_warnings(at)] == ["floor"]
    assert answer_warnings(_result(samples=4, accuracy=edge + 1e-9, constant_baseline=b)) == []
    assert answer_warnings(_result(accuracy=0.1, constant_baseline=0.19)) == []
    # too few prompts, or nothing measured: no verdict
    assert answer_warnings(_result(prompts=19, accuracy=0.57, top_answer_share=0.98,
                                   constant_baseline=0.59)) == []
    assert answer_warnings(_result(top_answer=None, top_answer_share=math.nan,
                                   constant_baseline=math.nan, baseline_answer=None)) == []
    assert answer_warnings(_result(top_answer_share=1.0, constant_baseline=math.nan,
                                   baseline_answer=None)) == []  # no gold answers


def test_results_files_without_the_new_fields_still_load(tmp_path):
    old = {"tasks": {"t": {"task": "t", "prompts": 2, "samples": 1, "accuracy": 0.5,
                           "mean_reward": 0.5, "format_rate": 1.0, "mean_length": 3.0}}}
    (tmp_path / "results.json").write_text(json.dumps(old))
    loaded = EvaluationResult.load(tmp_path / "results.json")
    assert loaded.tasks["t"].top_answer is None
    assert math.isnan(loaded.tasks["t"].constant_baseline)


class _ConstantBackend:
    """Every completion is the same text: a policy collapsed onto one answer."""

    def __init__(self, ids):
        self.ids = ids

    def generate(self, prompt_ids, params, num_samples=1):
        from mtgrpo.rollout import GenerationOutput

        prompts = [list(p) for p in prompt_ids for _ in range(num_samples)]
        return GenerationOutput(prompts, [list(self.ids) for _ in prompts],
                                [True] * len(prompts))

    def update_weights(self, model_or_state, version):
        pass


def test_an_evaluation_of_a_collapsed_policy_reports_and_warns(tiny_model_dir):
    from mtgrpo.models import load_tokenizer
    from mtgrpo.rewards import RewardSuite
    from mtgrpo.rollout import SamplingParams
    from mtgrpo.tasks import PromptSet, TaskSuite

    tokenizer = load_tokenizer(str(tiny_model_dir))
    with TaskSuite(["countdown:easy"], train_size=1, eval_size=24, workers=0,
                   use_cache=False) as suite:
        rows = suite.eval.rows()
        rewards = RewardSuite.from_user(suite.reward_routing)
    prompts = PromptSet(rows, tokenizer)
    ids = tokenizer.encode("<answer> 1 </answer>", add_special_tokens=False)
    result = evaluate_prompts(prompts, _ConstantBackend(ids), rewards,
                              SamplingParams(max_new_tokens=32, temperature=1.0), 2, tokenizer)
    task = result.tasks["countdown:easy"]
    assert (task.top_answer, task.top_answer_share) == ("1", 1.0)
    gold = [str(row["answer"]).strip() for row in rows]
    assert task.constant_baseline == pytest.approx(max(map(gold.count, gold)) / len(gold))
    metrics = result.metrics()
    assert metrics["tasks/countdown:easy/top_answer_share"] == 1.0
    assert metrics["tasks/countdown:easy/constant_baseline"] == task.constant_baseline
    warnings = answer_warnings(result)
    assert [kind for _, kind, _ in warnings] == ["collapse"]
    assert warnings[0][0] == "countdown:easy"


def _number_reward(prompts, completions, answer, **kwargs):
    from mtgrpo.rewards import completion_text, extract_answer

    return [float(extract_answer(completion_text(c)) == a) for c, a in
            zip(completions, answer, strict=True)]


def test_the_trainer_logs_each_warning_once_and_keeps_the_figures(tiny_model_dir, tmp_path,
                                                                   caplog):
    from mtgrpo import GRPOConfig, GRPOTrainer
    from mtgrpo.models import load_tokenizer

    # half the gold answers are "1": a policy that always answers "1" scores 50 %
    rows = [{"prompt": f"How many? {i}", "task": "count", "answer": "1" if i % 2 else "2"}
            for i in range(24)]
    ids = load_tokenizer(str(tiny_model_dir)).encode("<answer> 1 </answer>",
                                                     add_special_tokens=False)
    args = GRPOConfig(output_dir=str(tmp_path), max_steps=1, num_generations=2,
                      prompts_per_step=2, max_completion_length=32, max_prompt_length=64,
                      save_steps=0, logging_steps=1, seed=0, bf16=False)
    trainer = GRPOTrainer(str(tiny_model_dir), [_number_reward], args=args,
                          train_dataset=rows, eval_dataset=rows,
                          generation_backend=_ConstantBackend(ids))
    with caplog.at_level("WARNING", logger="mtgrpo.trainer.trainer"):
        first = trainer.evaluate()
        second = trainer.evaluate()
    messages = [r.getMessage() for r in caplog.records if "count:" in r.getMessage()]
    assert len(messages) == 2, messages  # one collapse, one floor; not again on the second
    assert any("100.0 % of the completions answer '1'" in m for m in messages)
    assert any("accuracy 50.0 % is no better than always answering '1'" in m for m in messages)
    for metrics in (first, second):
        assert metrics["eval_tasks/count/top_answer_share"] == 1.0
        assert metrics["eval_tasks/count/constant_baseline"] == 0.5
