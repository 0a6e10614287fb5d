"""The customer-communications example: prompt generator, the three judges on hand-written
replies, robustness on hostile text, the compliance gate's effect on advantages, and one training
step of configs/customer-comms.yaml on the tiny model."""

from __future__ import annotations

import json
import time
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mtgrpo.algo.advantages import Gate, compute_advantages
from mtgrpo.config import load_run_config
from mtgrpo.examples.customer_comms import (
    CHANNELS,
    MAX_REPLY_CHARS,
    SCENARIOS,
    SYSTEM_PROMPT,
    comms_judge,
    comms_reward,
    judge_reply,
    main,
    make_comms_reward,
    make_prompts,
    write_prompts,
)
from mtgrpo.recipes import recipe_path
from mtgrpo.rewards import RewardSuite
from mtgrpo.tasks import load_rows
from mtgrpo.trainer.run import run_training
from mtgrpo.trainer.setup import build_reward_suite
from tolerance import assert_close_f32

# Politeness = 0.25 acknowledge + 0.25 apology (or none due) + 0.30 no blame + 0.20 closing;
# next_step = 0 without an action, else 0.5 + 0.3 scenario term + 0.2 timeframe/reference.
IDEAL = ("Thank you for letting us know, and I'm sorry your order never arrived. I have opened "
         "a dispute with the merchant, and you will hear from us within 5 business days. Let us "
         "know if there is anything else we can do.")
CURT = "I have opened a dispute with the merchant."
POLITE_PROMISE = ("Thank you for letting us know, and I am so sorry. I guarantee you will get a "
                  "full refund. I have opened a dispute with the merchant, so let us know if "
                  "there is anything else.")
RUDE_PROMISE = ("I guarantee you will get a full refund. You should have checked the merchant "
                "first. I have opened a dispute with the merchant.")


# ------------------------------------------------------------------------------ prompts


def test_make_prompts_is_deterministic_and_balanced():
    rows = make_prompts(10, seed=3)
    assert rows == make_prompts(10, seed=3)
    assert rows != make_prompts(10, seed=4)
    # scenarios take turns: every block of five rows holds each scenario once
    names = SCENARIOS.names()
    assert sorted(r["task"] for r in rows[:5]) == names
    assert Counter(r["task"] for r in rows) == dict.fromkeys(names, 2)
    for number, row in enumerate(rows):
        assert row["id"] == f"comms/train/3/{number}"
        assert row["scenario"] == row["task"]
        assert row["split"] == "train"
        assert row["tone"] in {"calm", "anxious", "angry"}
        system, user = row["prompt"]
        assert system == {"role": "system", "content": SYSTEM_PROMPT}
        assert user["role"] == "user"
        assert user["content"].strip()
        assert "{" not in user["content"]  # every placeholder filled
    assert load_rows(rows) == rows


def test_make_prompts_options_and_errors():
    rows = make_prompts(4, seed=0, scenarios=["fraud_report", "refund"], system_prompt=None,
                        split="eval")
    assert Counter(r["task"] for r in rows) == {"fraud_report": 2, "refund": 2}
    assert all(len(r["prompt"]) == 1 and r["split"] == "eval" for r in rows)
    with pytest.raises(ValueError, match="n=0 must be a positive integer"):
        make_prompts(0)
    with pytest.raises(ValueError, match=r"unknown customer-communications scenario 'loan'.*"
                                         r"valid names: fee_dispute"):
        make_prompts(3, scenarios=["loan"])
    with pytest.raises(ValueError, match="lists a scenario twice"):
        make_prompts(3, scenarios=["refund", "refund"])


def test_write_prompts_and_its_command(tmp_path, capsys):
    written = write_prompts(tmp_path / "comms", train_size=20, eval_size=5, seed=1)
    train, evaluation = load_rows(written["train"]), load_rows(written["eval"])
    assert len(train) == 20
    assert len(evaluation) == 5
    assert {r["split"] for r in evaluation} == {"eval"}
    messages = {r["prompt"][-1]["content"] for r in train}
    assert not any(r["prompt"][-1]["content"] in messages for r in evaluation)
    assert main([str(tmp_path / "cli"), "--train-size", "6", "--eval-size", "2"]) == 0
    assert "eval: " in capsys.readouterr().out
    assert len(load_rows(tmp_path / "cli" / "train.jsonl")) == 6


# ------------------------------------------------------------------------------ judges


@pytest.mark.parametrize(("scenario", "reply", "expected", "violations"), [
    # ack .25 + apology .25 + no blame .30 + closing .20; action .5 + "dispute" .3 + "within" .2
    ("refund", IDEAL, (1.0, 1.0, 1.0), ()),
    # the guarantee fails compliance; apology .25 + no blame .30; no action ("guarantee" is not)
    ("refund", "I'm sorry about the missing order. I guarantee you will get a full refund "
               "today.", (0.0, 0.55, 0.0), ("guarantee",)),
    # "cannot" negates "guarantee" in its clause; action .5 + "merchant" .3
    ("refund", "I'm sorry about the missing order. We cannot guarantee the outcome, but I have "
               "opened a dispute with the merchant.", (1.0, 0.55, 0.8), ()),
    # a condition earlier in the sentence: not a promise; ack .25 + no blame .30 (no apology)
    ("fee_dispute", "I understand how frustrating this is. If the review finds the fee was "
                    "charged in error, we will refund it.", (1.0, 0.55, 0.0), ()),
    ("fee_dispute", "I understand. We will refund the fee right away.", (0.0, 0.55, 0.0),
     ("guarantee",)),
    # asks for secrets; only "no blame" .30; "please send" is an action .5, no scenario term
    ("refund", "Please send us your full card number and the CVV so we can check the payment.",
     (0.0, 0.3, 0.5), ("credential_request",)),
    ("locked_account", "What is your online banking password?", (0.0, 0.3, 0.0),
     ("credential_request",)),
    # "never ask" is a reassurance; the last four digits are not a secret; action + "block"
    ("fraud_report", "I'm so sorry this happened. We will never ask for your PIN or password. "
                     "Please reply with the last four digits of your card number, and I will "
                     "block the card right away.", (1.0, 0.55, 0.8), ()),
    # sending the customer a new PIN is not asking for one; action .5 + "within" .2; no apology
    ("fraud_report", "We'll send you a new PIN by post within 5 working days.",
     (1.0, 0.3, 0.7), ()),
    ("fee_dispute", "Honestly, you should sue them over this fee.", (0.0, 0.3, 0.0),
     ("legal_advice",)),
    # declining legal advice is compliant; apology .25 + no blame .30; action + "review"
    ("fee_dispute", "I'm sorry, but we can't give legal advice. You can request a review of "
                    "the fee in the app.", (1.0, 0.55, 0.8), ()),
    ("refund", "I promise you'll get your money back. Just confirm your PIN. You have a strong "
               "case.", (0.0, 0.3, 0.0), ("guarantee", "credential_request", "legal_advice")),
    # no apology is due for a limit request: ack .25 + .25 + .30 + closing .20
    ("limit_increase", "Thanks for reaching out! You can request a higher limit in the app. "
                       "Happy to help.", (1.0, 1.0, 0.8), ()),
    # the same words for a refund: the missing apology costs .25, no refund term costs .3
    ("refund", "Thanks for reaching out! You can request a higher limit in the app. Happy to "
               "help.", (1.0, 0.75, 0.5), ()),
    # blame costs .30: apology .25 + closing .20
    ("fee_dispute", "I'm sorry, but you should have checked your balance before paying. Let "
                    "us know if you need anything else.", (1.0, 0.45, 0.0), ()),
    # "not your fault" is not blame: apology .25 + no blame .30; action + "frozen"
    ("fraud_report", "This is not your fault, and I am sorry. I have frozen your card.",
     (1.0, 0.55, 0.8), ()),
    # an insult zeroes politeness; "please check" + "app"
    ("locked_account", "Deal with it, this is not my problem. Please check the app.",
     (1.0, 0.0, 0.8), ()),
    # fewer than five words: neither polite nor a next step
    ("locked_account", "Sorry, please reset it.", (1.0, 0.0, 0.0), ()),
    ("locked_account", "", (1.0, 0.0, 0.0), ()),
])
def test_judge_reply_exact_values(scenario, reply, expected, violations):
    scores = judge_reply(reply, scenario)
    assert scores.channels == expected
    assert scores.violations == violations


def test_judge_reply_forms_and_limits():
    conversational = [{"role": "assistant", "content": IDEAL}]
    assert judge_reply(conversational, "refund") == judge_reply(IDEAL, "refund")
    assert judge_reply(IDEAL.replace("I'm", "I\u2019m"), "refund") == judge_reply(IDEAL, "refund")
    too_long = judge_reply("Sorry. " * (MAX_REPLY_CHARS // 7 + 1), "refund")
    assert too_long.channels == (0.0, 0.0, 0.0)
    assert too_long.violations == ("too_long",)
    for not_text in (None, 42, {"content": 3}):
        assert judge_reply(not_text, "refund").channels == (1.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="unknown customer-communications scenario 'loans'"):
        judge_reply(IDEAL, "loans")


HOSTILE = [
    "sorry " * 3333, "," * 19_999, "not guarantee " * 1400, "please send your pin " * 950,
    "\n" * 19_999, "i have " * 2800, "if " * 6600 + "we will refund", "100" * 6000 + "%",
    "within 1" * 2400, "(" * 19_999, "\u0130" * 19_999, "\x00\ud7ff\U0010ffff" * 6000,
    "x" * 10_000_000,
]


def test_judges_are_fast_and_bounded_on_hostile_text():
    for text in HOSTILE:
        start = time.perf_counter()
        scores = judge_reply(text, "fraud_report")
        elapsed = time.perf_counter() - start
        assert elapsed < 0.5, (text[:20], elapsed)  # ~10 ms here; generous for a loaded CI box
        assert scores.compliance in (0.0, 1.0)
        assert 0.0 <= scores.politeness <= 1.0
        assert 0.0 <= scores.next_step <= 1.0


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("abcdefghinoprstuwy '.,;!?\n%$0123456789")) |
               st.characters(), max_size=400),
       st.sampled_from(SCENARIOS.names()))
def test_judges_never_raise_and_stay_in_range(text, scenario):
    scores = judge_reply(text, scenario)
    assert scores.compliance == (0.0 if scores.violations else 1.0)
    assert 0.0 <= scores.politeness <= 1.0
    assert 0.0 <= scores.next_step <= 1.0


def test_batched_judge_columns_and_errors():
    suite = RewardSuite.from_user([comms_reward])
    assert suite.channel_names == [f"comms/{c}" for c in CHANNELS]
    out = comms_judge(None, [IDEAL, CURT], scenario=["refund", None])
    assert out == [(1.0, 1.0, 1.0), None]
    with pytest.raises(TypeError, match="needs the dataset column 'scenario'"):
        comms_judge(None, [IDEAL], task=["refund"])
    with pytest.raises(ValueError, match="2 scenario values for 1 completions"):
        comms_judge(None, [IDEAL], scenario=["refund", "refund"])
    with pytest.raises(ValueError, match="unknown customer-communications scenario"):
        comms_judge(None, [IDEAL], scenario=["mortgage"])


# ------------------------------------------------------------------------------ the gate


def _na(rewards: torch.Tensor, weights: list[float]) -> np.ndarray:
    """Plain normalise-then-sum of one group (ddof 1, eps 1e-4), the ALGORITHMS §2 formula."""
    r = rewards.double().numpy()
    z = (r - r.mean(axis=0)) / (r.std(axis=0, ddof=1) + 1e-4)
    return z @ np.asarray(weights)


def test_gate_zeroes_politeness_for_non_compliant_rows_hand_built():
    suite = RewardSuite.from_user([comms_reward], reward_weights=[1.0, 1.0, 0.5])
    assert suite.gates == [Gate(channel=1, on=0, mode="subgroup", threshold=1.0)]
    rewards = torch.tensor([[1.0, 0.8, 0.5],
                            [1.0, 0.4, 1.0],
                            [0.0, 1.0, 0.5],    # non-compliant, most polite
                            [1.0, 0.6, 0.0]])
    weights = [1.0, 1.0, 0.5]
    gated = compute_advantages(rewards, 4, reward_weights=weights, aggregation="na",
                               gates=suite.gates).advantages
    # subgroup gate: politeness centred over the compliant rows 0, 1, 3 (mean 0.6) and 0 for
    # row 2, i.e. [0.2, -0.2, 0, 0]; then each channel is normalised and weighted
    expected = _na(torch.tensor([[1.0, 0.2, 0.5], [1.0, -0.2, 1.0], [0.0, 0.0, 0.5],
                                 [1.0, 0.0, 0.0]]), weights)
    # the float32 estimator against the float64 formula: a few roundings of values up to ~3
    # (a gate that let row 2's politeness through moves the advantages by more than 0.1)
    assert_close_f32(gated, expected.tolist(), ulps=8)
    # row 2's politeness has no influence on any advantage
    rude = rewards.clone()
    rude[2, 1] = 0.0
    again = compute_advantages(rude, 4, reward_weights=weights, aggregation="na",
                               gates=suite.gates).advantages
    torch.testing.assert_close(again, gated, rtol=0, atol=0)
    # without the gate it does: the polite non-compliant row is pulled up
    ungated = compute_advantages(rewards, 4, reward_weights=weights, aggregation="na").advantages
    ungated_rude = compute_advantages(rude, 4, reward_weights=weights, aggregation="na").advantages
    assert ungated[2] - ungated_rude[2] > 0.5


def test_gate_on_judged_replies_ignores_politeness_of_a_promise():
    def advantages(reward, third_reply):
        suite = RewardSuite.from_user([reward], reward_weights=[1.0, 1.0, 0.5])
        replies = [IDEAL, CURT, third_reply, CURT]
        scores = suite.score([None] * 4, replies, None, {"scenario": ["refund"] * 4},
                             ["refund"] * 4)
        return scores.values, compute_advantages(
            scores.values, 4, reward_weights=suite.reward_weights, aggregation="na",
            gates=suite.gates).advantages

    values, polite = advantages(comms_reward, POLITE_PROMISE)
    torch.testing.assert_close(torch.from_numpy(values), torch.tensor(
        [[1.0, 1.0, 1.0], [1.0, 0.3, 0.8], [0.0, 1.0, 0.8], [1.0, 0.3, 0.8]],
        dtype=torch.float64))
    rude_values, rude = advantages(comms_reward, RUDE_PROMISE)
    assert rude_values[2].tolist() == pytest.approx([0.0, 0.0, 0.8], abs=1e-7)
    # gated: the promise's politeness (1.0 vs 0.0) changes nothing
    torch.testing.assert_close(polite, rude, rtol=0, atol=0)
    assert polite[2] < min(polite[0], polite[1])  # the non-compliant reply ranks last
    # ungated (the ablation): the polite promise is rewarded for its politeness
    _, polite_ungated = advantages(make_comms_reward(None), POLITE_PROMISE)
    _, rude_ungated = advantages(make_comms_reward(None), RUDE_PROMISE)
    assert polite_ungated[2] > rude_ungated[2] + 0.5


def test_zero_fill_gate_and_bad_mode():
    reward = make_comms_reward("zero_fill")
    suite = RewardSuite.from_user([reward])
    assert suite.gates == [Gate(channel=1, on=0, mode="zero_fill", threshold=1.0)]
    with pytest.raises(ValueError, match="gate mode 'soft' is not valid"):
        make_comms_reward("soft")


# ------------------------------------------------------------------------------ the config


def test_config_resolves_the_gated_judge():
    run = load_run_config(recipe_path("customer-comms"))
    assert run.training.advantage.multi_objective_aggregation == "normalize_then_sum"
    suite = build_reward_suite(run.rewards, run.training)
    assert suite.channel_names == ["comms/compliance", "comms/politeness", "comms/next_step"]
    np.testing.assert_array_equal(suite.reward_weights, [1.0, 1.0, 0.5])
    assert suite.gates == [Gate(channel=1, on=0, mode="subgroup", threshold=1.0)]
    ablation = load_run_config(recipe_path("customer-comms"), [
        "--rewards",
        '[{name: "mtgrpo.examples.customer_comms:make_comms_reward", gate_mode: null}]'])
    assert build_reward_suite(ablation.rewards, ablation.training).gates == []


def test_customer_comms_config_trains_one_step_on_the_tiny_model(tmp_path, tiny_model_dir):
    files = write_prompts(tmp_path / "data", train_size=6, eval_size=2, seed=0)
    run = load_run_config(recipe_path("customer-comms"), [
        "--model.name_or_path", str(tiny_model_dir), "--bf16", "false",
        "--data.train", str(files["train"]), "--data.eval", "null",
        "--output_dir", str(tmp_path / "run"), "--max_steps", "1", "--num_generations", "2",
        "--prompts_per_step", "2", "--per_device_train_batch_size", "4",
        "--max_prompt_length", "128", "--max_completion_length", "8", "--save_steps", "0",
        "--eval_steps", "0",
    ])
    metrics = run_training(run)
    assert np.isfinite(metrics["loss"])
    for channel in CHANNELS:
        assert f"rewards/comms/{channel}/mean" in metrics
    trained = {r["task"] for r in load_rows(files["train"])}
    assert {k.split("/")[1] for k in metrics if k.endswith("/weight")} == trained
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["split"] == "run"  # how the run computes, then the steps
    record = json.loads(lines[1])
    assert record["step"] == 1
