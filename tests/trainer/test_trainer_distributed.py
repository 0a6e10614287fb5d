"""`accelerate launch --num_processes 2` on CPU (gloo) agrees with one process."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from scripted_backend import OFFSETS, TRUNCATED_OFFSET

from tolerance import assert_close_f32, f32_atol

SCRIPT = Path(__file__).with_name("distributed_script.py")
MISMATCH_SCRIPT = Path(__file__).with_name("mismatch_script.py")
MISMATCH_KEYS = ("generation/logprob_mismatch_mean", "generation/logprob_mismatch_max",
                 "generation/kl_k3")


def _free_port() -> int:
    """A port no other process listens on now (engineers and CI jobs share machines)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def script_env() -> dict[str, str]:
    """The launched scripts' environment: this directory's helpers importable (before any
    PYTHONPATH of the caller's, kept: a checkout run from its source tree), one thread each."""
    path = os.pathsep.join(p for p in (str(SCRIPT.parent), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")


def _accelerate_launch(script: Path, processes: int, *argv: str) -> None:
    env = script_env()
    # accelerate's multi-process launcher is torchrun ("--multi_gpu"); without a GPU the
    # trainer's Accelerator(cpu=True) joins a gloo process group.
    launcher = "--multi_gpu" if processes > 1 else "--cpu"
    command = [sys.executable, "-m", "accelerate.commands.launch", launcher,
               "--num_processes", str(processes), "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(_free_port()), str(script), *argv]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    # each process's exception, which the launcher's own report would push out of the tail
    raised = [line for line in done.stderr.splitlines() if line.startswith("[rank")
              and "Error" in line]
    assert done.returncode == 0, "\n".join([*raised[-8:], done.stderr[-3000:]])


def _launch(model: Path, out: Path, processes: int, *options: str) -> dict:
    _accelerate_launch(SCRIPT, processes, str(model), str(out), *options)
    result = json.loads((out / "result.json").read_text())
    result["rollouts"] = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    return result


def test_two_processes_match_one_process(tiny_model_dir, tmp_path):
    with ThreadPoolExecutor(2) as pool:  # independent runs, side by side (I/O-bound waits)
        one, two = pool.map(lambda n: _launch(tiny_model_dir, tmp_path / f"world{n}", n), (1, 2))
    assert (one["world"], two["world"]) == (1, 2)
    # the same groups, rewards and first-step advantages on every rank
    assert len(one["rollouts"]) == len(two["rollouts"]) > 0
    for a, b in zip(one["rollouts"], two["rollouts"], strict=True):
        assert (a["prompt_id"], a["rewards"]) == (b["prompt_id"], b["rewards"])
        assert a["advantages"] == pytest.approx(b["advantages"], abs=1e-9)
    # the same task weights after the first update (they use the gathered I_k and J_k); I_k
    # comes from float32 forward passes over differently split batches, hence float32 agreement
    # (tests/tolerance.py: 16 ulps of 1 is 2e-6, a ten-thousandth of the 0.02 that the update
    # moves them by here, so a rank's statistics left out of the gather would show)
    assert_close_f32(one["weights"], two["weights"], ulps=16)
    assert one["weights"] != pytest.approx([0.5, 0.5], abs=1e-3)  # the update did move them
    # the same update: DDP averages gradients, the loss normaliser is the whole batch's
    assert two["param_sum"] == pytest.approx(one["param_sum"], rel=1e-6)
    _same_logged_figures(tmp_path / "world1", tmp_path / "world2")


def _same_logged_figures(one: Path, two: Path) -> None:
    """The step's logged figures are the whole batch's on any number of processes (each
    process's share gathered, not the main process's alone), to float32 agreement."""
    from mtgrpo.reporting import read_metrics

    first, second = read_metrics(one, split="train")[0], read_metrics(two, split="train")[0]
    keys = ("loss", "clip_ratio/low", "clip_ratio/high", "clip_ratio/region", "entropy")
    assert all(isinstance(first[k], float) for k in keys)
    for key in keys:
        assert_close_f32(second[key], first[key], ulps=64, msg=key)


def test_uneven_shares_take_every_optimizer_step_together(tiny_model_dir, tmp_path):
    # one process has rows for 4 of the 6 optimizer steps of a batch: it takes the other two
    # with filler passes (the gradient all-reduce, the normaliser's reduce and, with
    # top_entropy_quantile, the quantile's gather in every micro-batch), else every process
    # would wait for it; the schedule follows the optimizer steps taken
    # (--fillers: a filler pass that is not the step's last runs under no_sync, as the other
    # process's real micro-batch there does, else its all-reduce pairs with the wrong one)
    from mtgrpo.reporting import read_metrics

    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(
            lambda flag: _launch(tiny_model_dir, tmp_path / flag, 2, f"--{flag}"),
            ("uneven", "fillers")))
    for flag, run in zip(("uneven", "fillers"), runs, strict=True):
        assert run["world"] == 2
        steps = read_metrics(tmp_path / flag, split="train")
        assert [r["step"] for r in steps] == [1, 2]
        assert all(math.isfinite(r["loss"]) and math.isfinite(r["entropy"]) for r in steps)


def test_a_process_without_a_group_does_not_dilute_the_loss(tiny_model_dir, tmp_path):
    # one group on two processes: process 1 trains a fully masked padding group, whose rows
    # are no sequences of the batch; grpo's per-sequence mean must divide by the real ones
    with ThreadPoolExecutor(2) as pool:
        one, two = pool.map(
            lambda n: _launch(tiny_model_dir, tmp_path / f"world{n}", n, "--one-group"), (1, 2))
    assert (one["world"], two["world"]) == (1, 2)
    # the same groups generated (DAPO's dynamic sampling keeps one with a gradient)
    assert [r["prompt_id"] for r in one["rollouts"]] == [r["prompt_id"] for r in two["rollouts"]]
    assert one["moved"] > 0.0
    # SGD moves the weights in proportion to the gradient: counting the padding rows halved it
    assert two["moved"] == pytest.approx(one["moved"], rel=1e-4)
    _same_logged_figures(tmp_path / "world1", tmp_path / "world2")


# ---------------------------------------------------------------- generation/logprob_mismatch_*
def _launch_mismatch(model: Path, out: Path, case: str) -> list[dict]:
    """Two processes of mismatch_script.py; what each logged, in rank order."""
    _accelerate_launch(MISMATCH_SCRIPT, 2, str(model), str(out), case)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def _pooled_mismatch(calls: list[dict], truncated_trained: bool) -> dict[str, float]:
    """The metrics by hand over every trained token of every engine call (its truncated rows'
    only when ``truncated_trained``): the engine reported ``log π + δ`` for each of ``n``
    tokens, so ``trainer − engine = −δ`` there and

        mean = Σ n·|δ| / Σ n      max = max over calls with n > 0 of |δ|
        k3   = Σ n·(exp(−δ) − 1 + δ) / Σ n."""
    calls = [c for c in calls if c["finished"] or truncated_trained]
    n = np.array([c["tokens"] for c in calls], dtype=np.float64)
    delta = -np.array([c["offset"] for c in calls], dtype=np.float64)
    return {"generation/logprob_mismatch_mean": float((n * np.abs(delta)).sum() / n.sum()),
            "generation/logprob_mismatch_max": float(np.abs(delta[n > 0]).max()),
            "generation/kl_k3": float((n * (np.expm1(delta) - delta)).sum() / n.sum())}


def _mismatch_atol(model: Path) -> dict[str, float]:
    """The engine's log-prob is one unpadded float32 forward, the trainer's one padded batched
    forward with a chunked log-softmax: 32 ulps (tests/tolerance.py) of the roundings'
    magnitude, the log-softmax normaliser (about log V for this small random model, times 2 for
    a margin) plus the largest offset, stored with it in float32. A mean or max of |Δ| moves
    by at most the per-token error; k3's slope |exp(−δ) − 1| is below 2 at every offset."""
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    scale = 2 * math.log(vocab) + max(abs(d) for d in (*OFFSETS, TRUNCATED_OFFSET))
    per_token = f32_atol(scale, ulps=32)
    return {"generation/logprob_mismatch_mean": per_token,
            "generation/logprob_mismatch_max": per_token, "generation/kl_k3": 2 * per_token}


def _assert_every_rank_logs(ranks: list[dict], run: str, atol: dict[str, float],
                            truncated_trained: bool) -> list[dict]:
    """Every process logs, at every step, the same values (bit for bit: they reduce the same
    gathered tokens) and they are the hand-derived ones over all processes' trained tokens;
    returns each step's expected values and engine calls."""
    steps = []
    for step, records in enumerate(zip(*(r[run]["records"] for r in ranks), strict=True), 1):
        calls = [call for record in records for call in record["calls"]]
        expected = _pooled_mismatch(calls, truncated_trained)
        for rank, record in enumerate(records):
            logged = record["metrics"]
            assert logged == records[0]["metrics"], f"{run} step {step}: rank {rank} differs"
            for key in MISMATCH_KEYS:
                assert abs(logged[key] - expected[key]) <= atol[key], \
                    (run, step, rank, key, logged[key], expected[key])
        steps.append({"expected": expected, "calls": calls})
    return steps


def test_the_logprob_mismatch_is_merged_over_every_process_token_by_token(tiny_model_dir,
                                                                          tmp_path):
    """Process r's engine reports log-probs OFFSETS[r] away from the policy's, on uneven shares
    (3 groups on 2 processes), and far away on the truncated rows that the update leaves out:
    every process must log the mismatch of all trained tokens pooled, which is neither process's
    own value nor the mean of their means."""
    ranks = _launch_mismatch(tiny_model_dir, tmp_path, "offsets")
    assert [r["offsets"]["world"] for r in ranks] == [2, 2]
    atol = _mismatch_atol(tiny_model_dir)
    steps = _assert_every_rank_logs(ranks, "offsets", atol, truncated_trained=False)
    assert len(steps) == 2
    for step in steps:
        # the setup discriminates: both engines' tokens were trained, in unequal numbers, so
        # the pooled mean lies strictly between their own values and off their midpoint
        tokens = {r: sum(c["tokens"] for c in step["calls"] if c["offset"] == d)
                  for r, d in enumerate(OFFSETS)}
        assert tokens[0] != tokens[1], tokens
        assert min(tokens.values()) > 0, tokens
        mean = step["expected"]["generation/logprob_mismatch_mean"]
        margin = 100 * atol["generation/logprob_mismatch_mean"]
        for own in (abs(d) for d in OFFSETS):
            assert abs(mean - own) > margin
        assert abs(mean - np.mean(np.abs(OFFSETS))) > margin
        # the truncated rows' offset would be the max had they been counted
        assert step["expected"]["generation/logprob_mismatch_max"] == max(map(abs, OFFSETS))


def test_the_logprob_mismatch_with_a_rank_without_rows_or_without_engine_logprobs(
        tiny_model_dir, tmp_path):
    """One group on two processes: process 1 generates and trains nothing, yet logs process 0's
    values. An engine that returns no log-probs on process 1 only: no process logs a mismatch
    (on one process, too, it is logged only when every trained completion has the engine's
    log-probs), and training goes on in step (no process waits in a gather the other skipped)."""
    ranks = _launch_mismatch(tiny_model_dir, tmp_path, "edge_cases")
    # truncated completions are trained here (mask_truncated_completions off): counted
    [step] = _assert_every_rank_logs(ranks, "padding_rank", _mismatch_atol(tiny_model_dir),
                                     truncated_trained=True)
    # process 0 generated it all
    assert {c["offset"] for c in step["calls"]} == {OFFSETS[0], TRUNCATED_OFFSET}
    assert step["expected"]["generation/logprob_mismatch_max"] == TRUNCATED_OFFSET
    records = [r["rank1_without_logprobs"]["records"] for r in ranks]
    assert [len(r) for r in records] == [2, 2]
    for rank_records in records:
        for record in rank_records:
            assert not set(MISMATCH_KEYS) & set(record["metrics"]), record["metrics"]
