"""Every broken contract is a RewardError at the first scoring call, naming what and how to fix."""

from __future__ import annotations

import math
import traceback

import numpy as np
import pytest
import torch

from mtgrpo.rewards import RewardError, RewardFunction, RewardSuite
from mtgrpo.rewards.evaluation import PROBE_LIMIT


def score(suite: RewardSuite, tasks: list[str], **overrides):
    n = len(tasks)
    kwargs = {
        "prompts": [f"prompt {i}" for i in range(n)],
        "completions": [f"completion {i}" for i in range(n)],
        "completion_ids": None,
        "columns": {},
        "tasks": tasks,
    }
    kwargs.update(overrides)
    return suite.score(**kwargs)


def constant(value):
    def reward(prompts, completions, **kwargs):
        return [value] * len(completions)

    return reward


def test_reward_error_is_a_value_error():
    assert issubclass(RewardError, ValueError)


def test_wrong_number_of_values_names_function_sizes_and_fix():
    def code_reward(prompts, completions, **kwargs):
        return [1.0] * (len(completions) - 2)

    with pytest.raises(
        RewardError,
        match=r"^reward function 'code_reward' returned 6 rewards for 8 completions \(task "
        r"'code'\); a reward function must return one value \(or None\) per completion$",
    ) as info:
        score(RewardSuite.from_user(code_reward), ["code"] * 8)
    assert info.value.function == "code_reward"


@pytest.mark.parametrize(
    ("output", "kind"),
    [(1.0, "float"), ({"a": 1.0}, "dict"), ("0.5", "str"), (None, "NoneType")],
)
def test_output_that_is_not_a_list_is_refused(output, kind):
    def reward(prompts, completions, **kwargs):
        return output

    with pytest.raises(RewardError, match=rf"returned {kind} instead of a list of values for 2"):
        score(RewardSuite.from_user(reward), ["t", "t"])


def test_numeric_string_is_refused_with_the_fix():
    with pytest.raises(
        RewardError,
        match=r"returned the string '0.5'; return a float \(e.g. float\(x\)\), not a string "
        r"\(row 0, task 'math'\)",
    ) as info:
        score(RewardSuite.from_user(constant("0.5")), ["math", "code"])
    assert (info.value.row, info.value.task) == (0, "math")


def test_other_non_numbers_are_refused_naming_the_type():
    with pytest.raises(RewardError, match=r"returned 1j \(complex\); a reward must be a number"):
        score(RewardSuite.from_user(constant(1j)), ["t"])
    with pytest.raises(RewardError, match=r"\(Tensor\); a reward must be a number"):
        score(RewardSuite.from_user(constant(torch.ones(2))), ["t"])
    with pytest.raises(RewardError, match=r"must declare them: RewardFunction\(fn, channels="):
        score(RewardSuite.from_user(constant((1.0, 2.0))), ["t"])


@pytest.mark.parametrize(
    "bad", [math.nan, math.inf, -math.inf, np.float32("nan"), torch.tensor(math.inf)]
)
def test_non_finite_values_name_row_and_task(bad):
    def reward(prompts, completions, **kwargs):
        return [1.0, 0.0, bad]

    with pytest.raises(
        RewardError,
        match=r"reward function 'reward' returned -?(nan|inf); rewards must be finite: return "
        r"None where a reward does not apply \(row 2, task 'zebra'\)",
    ):
        score(RewardSuite.from_user(reward), ["math", "math", "zebra"])


def test_multi_channel_shape_errors_name_the_channels():
    def judge(out):
        return RewardFunction(constant(out), name="judge", channels=("a", "b", "c"))

    with pytest.raises(
        RewardError,
        match=r"returned 2 values but the function declares 3 channels \['a', 'b', 'c'\]; "
        r"return one value per channel in that order \(row 0, task 't'\)",
    ):
        score(RewardSuite.from_user(judge((1.0, 2.0))), ["t"])
    with pytest.raises(
        RewardError,
        match=r"a dict with missing channel\(s\) \['c'\] and unknown channel\(s\) \['d'\]",
    ):
        score(RewardSuite.from_user(judge({"a": 1.0, "b": 1.0, "d": 0.0})), ["t"])
    with pytest.raises(RewardError, match=r"returned 0.5 \(float\); a multi-channel function"):
        score(RewardSuite.from_user(judge(0.5)), ["t"])
    with pytest.raises(RewardError, match=r"returned the string 'x'"):
        score(RewardSuite.from_user(judge((1.0, "x", None))), ["t"])


def test_unscorable_row_names_task_row_and_functions():
    def math_reward(prompts, completions, task, **kwargs):
        return [1.0 if t == "math" else None for t in task]

    def fmt(prompts, completions, **kwargs):
        return [None] * len(completions)

    suite = RewardSuite.from_user({"math": [math_reward], "*": [fmt], "code": [constant(1.0)]})
    with pytest.raises(
        RewardError,
        match=r"no reward applies to row 1 \(task 'poetry'\): \['fmt'\] returned None and "
        r"\['math_reward', 'reward'\] are not routed to task 'poetry'; 2 of 4 completions are "
        r"unscorable \(task 'poetry'\)\. .*on_unscorable='zero_advantage'",
    ) as info:
        score(suite, ["math", "poetry", "code", "poetry"])
    assert (info.value.row, info.value.task) == (1, "poetry")
    plain = RewardSuite.from_user([math_reward, fmt])
    with pytest.raises(RewardError, match=r"\['math_reward', 'fmt'\] returned None; 1 of 2"):
        score(plain, ["math", "code"])


def test_unknown_task_label_fails_before_any_call():
    calls = []

    def math_reward(prompts, completions, **kwargs):
        calls.append(len(completions))
        return [1.0] * len(completions)

    suite = RewardSuite.from_user({"math": math_reward, "code": [constant(0.0)]})
    with pytest.raises(
        RewardError,
        match=r"no reward function is routed to task\(s\) \['poetry'\] \(task 'poetry' at rows "
        r"\[1, 2\]\): the routing table knows tasks \['code', 'math'\] and has no '\*' entry\. "
        r"Add the task to the routing table \('poetry': \[reward_fn\]\) or a '\*' entry",
    ):
        score(suite, ["math", "poetry", "poetry"])
    assert calls == []
    with pytest.raises(RewardError, match=r"task\(s\) \['chat', 'poetry'\]: the routing table"):
        suite.validate_tasks(["math", "poetry", "chat"])
    with pytest.raises(RewardError, match=r"task\(s\) \['poetry'\]"):
        suite.validate_tasks("poetry")


def test_empty_routing_entry_leaves_the_task_unscored():
    suite = RewardSuite.from_user({"math": [], "code": constant(1.0)})
    with pytest.raises(RewardError, match=r"no reward function is routed to task\(s\) \['math'\]"):
        suite.validate_tasks(["math", "code"])


def test_raising_function_is_reraised_with_first_failing_sample_and_cause():
    def code_reward(prompts, completions, task, **kwargs):
        return [1.0 / (len(c) - 10) for c in completions]

    long_prompt = "Write a function " + "that " * 30
    prompts = ["short", "p", long_prompt]
    completions = ["abcdefghijk", "abcdefghijklm", "0123456789"]  # row 2 has length 10
    with pytest.raises(RewardError) as info:
        score(
            RewardSuite.from_user({"code": code_reward}),
            ["code"] * 3,
            prompts=prompts,
            completions=completions,
        )
    err = info.value
    message = str(err)
    assert message.startswith(
        "reward function 'code_reward' raised ZeroDivisionError: float division by zero while "
        "scoring 3 completion(s) (task 'code'); first failing sample: row 2 (task 'code'), "
    )
    preview = repr(long_prompt[:77] + "...")  # 80 characters of the prompt
    assert f"prompt {preview}, completion '0123456789'" in message
    assert (err.function, err.row, err.task) == ("code_reward", 2, "code")
    assert isinstance(err.__cause__, ZeroDivisionError)
    frames = traceback.extract_tb(err.__cause__.__traceback__)
    assert "code_reward" in [frame.name for frame in frames]  # the user's frame is kept


def test_failing_sample_index_is_the_batch_row_for_routed_functions():
    def picky(prompts, completions, **kwargs):
        if "bad" in completions:
            raise KeyError("answer")
        return [0.0] * len(completions)

    suite = RewardSuite.from_user({"code": picky, "math": constant(1.0)})
    with pytest.raises(
        RewardError, match=r"first failing sample: row 3 \(task 'code'\).*alone raises KeyError"
    ):
        score(
            suite,
            ["code", "math", "math", "code"],
            completions=["ok", "bad", "ok", "bad"],
        )


def test_batch_dependent_failure_is_reported_as_such():
    def needs_pairs(prompts, completions, **kwargs):
        if len(completions) == 3:
            raise ValueError("batch of three")
        return [0.0] * len(completions)

    with pytest.raises(
        RewardError,
        match=r"called on each of the first 3 of these completions alone it raised nothing, so "
        r"the failure depends on the batch as a whole",
    ) as info:
        score(RewardSuite.from_user(needs_pairs), ["t"] * 3)
    assert isinstance(info.value.__cause__, ValueError)
    assert info.value.row is None


def test_the_probe_of_a_row_is_held_to_the_function_time_limit():
    import time

    def hangs_alone(prompts, completions, **kwargs):
        if len(completions) == 1:  # raised on the batch, hangs on a row: the probe must not
            time.sleep(60)
        raise ValueError("batch")

    begin = time.monotonic()
    with pytest.raises(RewardError, match=r"called on one completion at a time \(rows up to 0\)"
                                          r" it ran past its 0.3 s limit, so the failing sample "
                                          r"was not located") as info:
        score(RewardSuite.from_user(hangs_alone, timeout=0.3), ["t"] * 3)
    assert time.monotonic() - begin < 30
    assert isinstance(info.value.__cause__, ValueError)
    assert info.value.row is None


def test_the_probes_together_take_at_most_the_function_time_limit():
    import time

    def slow_alone(prompts, completions, **kwargs):
        if len(completions) == 1:  # each row alone ends in time, all of them would not
            time.sleep(0.2)
            return [0.0]
        raise ValueError("batch")

    begin = time.monotonic()
    with pytest.raises(RewardError, match=r"ran past its 0.5 s limit"):
        score(RewardSuite.from_user(slow_alone, timeout=0.5), ["t"] * 20)
    assert time.monotonic() - begin < 3.0  # 20 probes of 0.2 s would take 4 s


def test_probe_calls_at_most_the_first_64_rows():
    single_calls = []

    def fails_late(prompts, completions, **kwargs):
        if len(completions) == 1:
            single_calls.append(completions[0])
            if completions[0] == "row 100":
                raise RuntimeError("boom")
            return [0.0]
        raise RuntimeError("boom")

    n = 120
    with pytest.raises(RewardError, match=r"each of the first 64 of these completions alone"):
        score(
            RewardSuite.from_user(fails_late), ["t"] * n, completions=[f"row {i}" for i in range(n)]
        )
    assert single_calls == [f"row {i}" for i in range(PROBE_LIMIT)]
    assert PROBE_LIMIT == 64


def test_missing_kwargs_in_signature_gets_the_trl_hint():
    def strict(prompts, completions):
        return [0.0] * len(completions)

    with pytest.raises(RewardError, match=r"unexpected keyword argument.*add \*\*kwargs"):
        score(RewardSuite.from_user(strict), ["t"])


def test_misaligned_inputs_fail_before_any_call():
    calls = []

    def reward(prompts, completions, **kwargs):
        calls.append(1)
        return [0.0] * len(completions)

    suite = RewardSuite.from_user(reward)
    with pytest.raises(RewardError, match=r"column 'answer' has 1 entries for 2 completions"):
        score(suite, ["t", "t"], columns={"answer": ["1"]})
    with pytest.raises(RewardError, match=r"prompts has 3 entries for 2 completions"):
        score(suite, ["t", "t"], prompts=["a", "b", "c"])
    with pytest.raises(RewardError, match=r"tasks has 1 entries for 2 completions"):
        score(suite, ["t"], completions=["a", "b"], prompts=["a", "b"])
    with pytest.raises(RewardError, match=r"column 'n' must be a sequence .* got int"):
        score(suite, ["t"], columns={"n": 3})
    with pytest.raises(RewardError, match=r"argument name\(s\) \['completions'\] are given twice"):
        score(suite, ["t"], columns={"completions": ["x"]})
    with pytest.raises(RewardError, match=r"argument name\(s\) \['answer'\] are given twice"):
        score(suite, ["t"], columns={"answer": ["x"]}, extra={"answer": 1})
    with pytest.raises(RewardError, match=r"task labels must be strings, got 3"):
        score(suite, [3])
    assert calls == []
