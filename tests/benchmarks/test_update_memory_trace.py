"""``benchmarks/update_memory_trace.py``: the live-tensor count checked on tensors of known
sizes, and both traces of one update of each trainer on the tiny model."""

from __future__ import annotations

import pytest
import torch

from script_loader import load_script

trace_script = load_script("benchmarks/update_memory_trace.py")

MiB = 2**20


def test_live_tensors_by_hand():
    phase = ["a"]
    live = trace_script.LiveTensors(MiB, lambda: phase[0])
    with live:
        first = torch.zeros(MiB // 4)  # 1 MiB of float32
        second = torch.ones(2 * MiB // 4)  # 2 MiB
        small = torch.ones(10)  # below the threshold: not counted
        del first
        phase[0] = "b"
        third = torch.zeros(MiB // 4)  # 1 MiB: the total is back at 3, not above
    assert live.maximum == 3 * MiB
    assert sorted(size for size, _, _ in live.at_maximum) == [MiB, 2 * MiB]
    assert {(op, where) for _, op, where in live.at_maximum} == {
        ("aten.zeros.default", "a"), ("aten.ones.default", "a")}
    assert live.total == 3 * MiB  # second and third still alive
    del second, third, small


@pytest.mark.parametrize("trainer", ["ours", "trl"])
def test_both_traces_of_an_update_on_the_tiny_model(trainer):
    result = trace_script.trace("tiny", trainer, checkpointing=True, min_mib=0.001)
    assert {"forward", "backward", "optimizer"} <= set(result["phases"])
    assert all(peak >= -64 for peak in result["phases"].values())  # MiB above the start
    assert result["live"]["maximum"] > 0
    assert result["live"]["tensors"]
    phases = {"other", "forward", "backward", "clip", "optimizer",
              "backward:lm_head", "backward:model.norm"}
    assert {phase for _, _, phase in result["live"]["tensors"]} <= phases
    text = trace_script.report(result)
    assert f"{trainer} on tiny, gradient checkpointing on" in text
    assert "| forward |" in text
