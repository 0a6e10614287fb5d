"""Every built-in reward can be chosen from a run file with its options
(``{name: countdown_reward, use_all_numbers: false}``), and the docs' examples resolve."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from mtgrpo.config import run_config_from_dict
from mtgrpo.rewards.core import callable_name
from mtgrpo.rewards.registry import REWARD_FUNCTIONS, resolve_reward

DOCS = [Path(__file__).resolve().parents[2] / "docs" / name
        for name in ("rewards.md", "recipes.md")]

DONE = "8 * 2 = 16, minus 1.</think>\n<answer>8 * 2 - 1</answer>"


def test_countdown_options_from_a_run_file():
    strict = resolve_reward("countdown_reward")
    subset = resolve_reward(yaml.safe_load("{name: countdown_reward, use_all_numbers: false}"))
    columns = {"target": [15], "nums": [[8, 2, 4, 1]]}  # 4 is not used
    assert strict(None, [DONE], **columns) == [0.0]
    assert subset(None, [DONE], **columns) == [1.0]
    assert callable_name(subset) == "countdown_reward"  # the channel keeps its name
    loose = resolve_reward({"name": "countdown_reward", "require_format": False})
    assert loose(None, ["8 * 2 - 1"], target=[15], nums=[[8, 2, 1]]) == [1.0]


def test_length_reward_from_the_readme_form():
    reward = resolve_reward(yaml.safe_load("{name: length_reward, target_length: 200}"))
    # tolerance defaults to the target: 1 - |l - 200| / 200
    assert reward(None, ["x" * 200, "x" * 100, "x" * 450]) == [1.0, 0.5, 0.0]
    narrow = resolve_reward({"name": "length_reward", "target_length": 10, "tolerance": 5})
    assert narrow(None, ["x" * 12]) == [pytest.approx(0.6)]


def test_math_and_code_options():
    boxed_only = resolve_reward({"name": "math_reward", "styles": "boxed",
                                 "timeout_seconds": 5.0})
    default = resolve_reward("math_reward")
    texts = [r"so \boxed{\frac{1}{2}}", "<answer>0.5</answer>"]
    assert default(None, texts, answer=["0.5", "1/2"]) == [1.0, 1.0]
    assert boxed_only(None, texts, answer=["0.5", "1/2"]) == [1.0, 0.0]
    code = "<code>\ndef add(a, b):\n    return a + b if a else 0\n</code>"
    tests = [["assert add(1, 2) == 3", "assert add(0, 2) == 2"]]
    assert resolve_reward("code_reward")(None, [code], tests=tests) == [0.5]
    strict = resolve_reward({"name": "code_reward", "all_or_nothing": True, "max_workers": 1})
    assert strict(None, [code], tests=tests) == [0.0]


def test_factories_and_errors_name_the_options():
    zebra = resolve_reward({"name": "reasoning_gym_reward", "dataset_name": "zebra_puzzles"})
    assert zebra(None, ["<answer>Alice</answer>"], answer=["alice"]) == [1.0]
    with pytest.raises(ValueError, match=r"reward 'countdown_reward' has no option\(s\) "
                                         r"\['use_all'\]; its options: \['use_all_numbers', "
                                         r"'require_format'\]"):
        resolve_reward({"name": "countdown_reward", "use_all": False})
    with pytest.raises(ValueError, match=r"'format_reward' has no option\(s\) \['strict'\]; "
                                         r"its options: \[\]"):
        resolve_reward({"name": "format_reward", "strict": True})
    with pytest.raises(ValueError, match=r"'length_reward' has no option\(s\) \['target'\]"):
        resolve_reward({"name": "length_reward", "target": 3})
    with pytest.raises(ValueError, match=r"reward 'length_reward': .*target_length"):
        resolve_reward({"name": "length_reward", "unit": "chars"})


OPTIONS = {
    "format_reward": {},
    "countdown_reward": {"use_all_numbers": False, "require_format": False},
    "math_reward": {"styles": ["boxed", "tag"], "timeout_seconds": 1.0},
    "code_reward": {"all_or_nothing": True},
    "length_reward": {"target_length": 50, "tolerance": 10, "unit": "chars"},
    "reasoning_gym_reward": {"dataset_name": "arc_1d"},
    "answer_format_reward": {},
    "comms_reward": {},
}


@pytest.mark.parametrize("name", REWARD_FUNCTIONS.names())
def test_every_built_in_resolves_from_a_run_file_with_its_options(name):
    assert name in OPTIONS, f"add the options of the new built-in {name!r} to this test"
    reward = resolve_reward({"name": name, **OPTIONS[name]})
    assert callable(reward)
    run = run_config_from_dict({"model": "m", "rewards": [{"name": name, **OPTIONS[name]}]})
    assert run.rewards.to_value() == [{"name": name, **OPTIONS[name]}]


def test_the_documented_reward_examples_resolve():
    spans = [span for page in DOCS
             for span in re.findall(r"`(\{name: [^`]+\})`", page.read_text(encoding="utf-8"))]
    assert spans, "docs/rewards.md shows reward entries with options"
    for span in spans:
        spec = yaml.safe_load(span)
        reward = resolve_reward(spec)
        assert callable_name(reward).startswith(spec["name"].removesuffix("_reward"))
    assert len(spans) >= 3
