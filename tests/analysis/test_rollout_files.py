"""Tests of the rollouts.jsonl / .npz readers and the .npz writer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mtgrpo.analysis import (
    analyze,
    load_rollouts,
    load_rollouts_jsonl,
    save_rollouts_npz,
)

CHANNELS = ["correct", "format"]


def _group(step: int, prompt_id, rewards, task: str = "countdown") -> dict:
    return {"step": step, "prompt_id": prompt_id, "task": task, "channels": CHANNELS,
            "rewards": rewards, "advantages": [0.0] * len(rewards)}


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    return path


def _rows(value: float, size: int = 4) -> list[list[float | None]]:
    return [[value + j, None if j == 1 else float(j % 2)] for j in range(size)]


@pytest.fixture
def rollouts_file(tmp_path: Path) -> Path:
    records = [
        _group(0, "a", _rows(0.0)),
        _group(0, 7, _rows(10.0), task="zebra"),
        _group(1, "a", _rows(1.0)),
        _group(1, 7, _rows(11.0), task="zebra"),
        _group(1, "lonely", _rows(99.0)),  # one group only: dropped with min_seeds = 2
        _group(2, "a", _rows(2.0)),  # a's third group: truncated to S = 2
        _group(2, 7, [[5.0, 1.0]] * 6, task="zebra"),  # size 6, not the common 4: skipped
    ]
    return _write_jsonl(tmp_path / "rollouts.jsonl", records)


def test_jsonl_groups_by_prompt_keeps_nulls_and_truncates(rollouts_file: Path):
    data = load_rollouts(rollouts_file, min_seeds=2)
    assert data.shape == (2, 2, 4, 2)
    assert data.prompt_ids == ("a", "7")
    assert data.tasks == ("countdown", "zebra")
    assert data.channels == tuple(CHANNELS)
    assert (data.skipped_groups, data.dropped_prompts, data.truncated_groups) == (1, 1, 1)
    expected = np.array([[_rows(0.0), _rows(1.0)], [_rows(10.0), _rows(11.0)]], dtype=float)
    np.testing.assert_array_equal(data.rewards, expected)  # None -> NaN, compared NaN-aware
    assert np.isnan(data.rewards[..., 1, 1]).all()
    assert data.weights is None


def test_jsonl_selects_the_requested_group_size_and_min_seeds(rollouts_file: Path):
    with pytest.raises(ValueError, match="no prompt .* has at least 2 groups of size 6 "
                                         r"\(the most any prompt has is 1\)"):
        load_rollouts_jsonl(rollouts_file, group_size=6)
    data = load_rollouts_jsonl(rollouts_file, min_seeds=3)
    assert data.prompt_ids == ("a",)
    assert data.shape == (1, 3, 4, 2)
    with pytest.raises(ValueError, match="no group of size 5"):
        load_rollouts_jsonl(rollouts_file, group_size=5)
    with pytest.raises(ValueError, match="min_seeds must be an integer >= 2"):
        load_rollouts_jsonl(rollouts_file, min_seeds=1)


def test_a_channel_none_for_a_whole_group_has_zero_z(tmp_path: Path):
    # prompt "p": channel 1 is None in every completion of every group -> its z is 0, so it
    # adds nothing to Ĉ or to either influence; channel 0 behaves as a single channel.
    rng = np.random.default_rng(0)
    records = [_group(s, "p", [[float(v), None] for v in rng.normal(size=6)]) for s in range(5)]
    data = load_rollouts(_write_jsonl(tmp_path / "r.jsonl", records))
    result = analyze(data.rewards, [1.0, 3.0])
    np.testing.assert_array_equal(result.c_hat[0, 1], [0.0, 0.0])
    assert result.influence_na[0, 1] == 0.0
    assert result.influence_an[0, 1] == 0.0
    # channel 0 alone: Ĉ00 = 1 − O(δ), prediction (1/m)·w0²·Ĉ00 = 1/6
    assert result.predicted[0] == pytest.approx(1 / 6, rel=1e-6)


def test_npz_round_trip(tmp_path: Path):
    rewards = np.random.default_rng(1).normal(size=(3, 4, 5, 2))
    rewards[0, 1, 2, 1] = np.nan
    path = save_rollouts_npz(tmp_path / "sub" / "rewards.npz", rewards, weights=[1.0, 0.5],
                             channels=CHANNELS, prompt_ids=["x", "y", "z"])
    assert path.is_file()
    data = load_rollouts(path)
    np.testing.assert_array_equal(data.rewards, rewards)
    np.testing.assert_array_equal(data.weights, [1.0, 0.5])
    assert data.channels == tuple(CHANNELS)
    assert data.prompt_ids == ("x", "y", "z")
    bare = load_rollouts(save_rollouts_npz(tmp_path / "bare.npz", rewards))
    assert bare.channels == ("r0", "r1")
    assert bare.weights is None
    assert bare.prompt_ids == ("p0", "p1", "p2")


def test_npz_errors(tmp_path: Path):
    np.savez(tmp_path / "wrong_key.npz", scores=np.zeros((1, 2, 3, 1)))
    with pytest.raises(ValueError, match="has no array 'rewards'"):
        load_rollouts(tmp_path / "wrong_key.npz")
    np.savez(tmp_path / "flat.npz", rewards=np.zeros((6, 2)))
    with pytest.raises(ValueError, match=r"must have shape \[P, S, m, R\]"):
        load_rollouts(tmp_path / "flat.npz")
    np.savez(tmp_path / "short.npz", rewards=np.zeros((1, 2, 3, 2)), weights=np.ones(3))
    with pytest.raises(ValueError, match=r"weights in .* has 3 entries but the rewards have 2"):
        load_rollouts(tmp_path / "short.npz")
    with pytest.raises(ValueError, match="groups of size 3, not the requested 4"):
        load_rollouts(tmp_path / "short.npz", group_size=4)
    with pytest.raises(ValueError, match=r"channels in .* has 1 entries"):
        save_rollouts_npz(tmp_path / "x.npz", np.zeros((1, 2, 3, 2)), channels=["only"])


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        (["{not json"], "line 1 of .* is not valid JSON"),
        (["[1, 2]"], "line 1 of .* is not a JSON object"),
        ([json.dumps({"prompt_id": 1, "rewards": [[1.0]]})], r"lacks \['channels'\]"),
        ([json.dumps(_group(0, "a", [[1.0]]))], "every rewards row must list 2 values"),
        ([json.dumps(_group(0, "a", [[1.0, "x"]]))], "rewards must be numbers or null"),
        ([json.dumps(_group(0, "a", [[1.0, 1.0]])),
          json.dumps({**_group(1, "a", [[1.0, 1.0]]), "channels": ["format", "correct"]})],
         "line 2 .* has channels"),
        ([""], "holds no rollouts"),
    ],
)
def test_jsonl_errors_name_the_line_and_the_rule(tmp_path: Path, lines, match):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=match):
        load_rollouts(path)


def test_missing_file_and_unknown_suffix(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match=r"rollouts file .*nowhere\.jsonl' does not exist"):
        load_rollouts(tmp_path / "nowhere.jsonl")
    (tmp_path / "r.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"suffix '.csv'; valid suffixes: .jsonl, .npz"):
        load_rollouts(tmp_path / "r.csv")
