"""The update-memory benchmark (``benchmarks/update_memory.py``): its fixed batch and option
checks, and its ``--quick`` sweep end to end (the tiny model, ours and TRL, gradient
checkpointing off and on, each in a process of its own). The report's structure and the
consistency of its figures are checked, never a memory ratio. TRL is a benchmark-only extra, so
the module skips without it."""

from __future__ import annotations

import re

import pytest

from script_loader import load_script

pytest.importorskip("trl")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

update_memory = load_script("benchmarks/update_memory.py")


def test_the_fixed_batch_is_grouped_seeded_and_centred():
    workload = update_memory.MODELS.get("tiny")
    batch = update_memory.fixed_batch(workload, seed=0)
    rows = workload.num_prompts * workload.group_size
    assert len(batch.prompt_ids) == len(batch.completion_ids) == len(batch.advantages) == rows
    for group in range(workload.num_prompts):
        members = range(group * workload.group_size, (group + 1) * workload.group_size)
        prompts = {tuple(batch.prompt_ids[i]) for i in members}
        assert len(prompts) == 1  # the G rows of a group share their prompt
        assert len(next(iter(prompts))) == workload.prompt_tokens
        # advantages have their group's mean removed: they sum to 0 up to float64 rounding
        assert abs(sum(batch.advantages[i] for i in members)) < 1e-12
    lengths = [len(ids) for ids in batch.completion_ids]
    assert min(lengths) >= workload.max_new_tokens // 2
    assert max(lengths) <= workload.max_new_tokens
    assert batch.completion_tokens == sum(lengths)
    assert all(0 <= t < 256 for ids in batch.completion_ids for t in ids)
    assert update_memory.fixed_batch(workload, seed=0) == batch
    assert update_memory.fixed_batch(workload, seed=1) != batch


def test_bad_options_name_the_valid_ones():
    with pytest.raises(ValueError, match="tiny"):
        update_memory.config_from_args(["--models", "gpt-5"])
    with pytest.raises(ValueError, match="use off, on or off,on"):
        update_memory.config_from_args(["--checkpointing", "maybe"])
    with pytest.raises(ValueError, match="use a subset of"):
        update_memory.config_from_args(["--trainers", "ours,deepspeed"])
    with pytest.raises(ValueError, match="warmup"):
        update_memory.Setting("tiny", "ours", False, warmup=-1)
    config, _ = update_memory.config_from_args(["--quick", "--checkpointing", "on"])
    assert config.models == ("tiny",)
    assert [(s.trainer, s.gradient_checkpointing) for s in config.settings()] == [
        ("ours", True), ("trl", True)]


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("update-memory") / "report.md"
    return update_memory.main(["--quick", "--out", str(out)]), out


def _table(text: str, heading: str) -> list[list[str]]:
    """The rows (cells) of the Markdown table under ``heading``, header and rule left out."""
    section = text.split(heading, 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    end = next((i for i, line in enumerate(rows) if i > 1 and line.startswith("| model")),
               len(rows))
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in rows[2:end]]


def test_the_quick_sweep_reports_every_setting_with_consistent_figures(quick_report):
    text, out = quick_report
    assert out.read_text(encoding="utf-8") == text
    assert "Command: `python benchmarks/update_memory.py --quick --out" in text
    machine = re.search(r"^Machine: (.+)$", text, re.MULTILINE).group(1)
    for part in ("cpu ", "avx512_bf16 ", "amx_bf16 ", "torch ", "transformers ", "trl "):
        assert part in machine

    summary = _table(text, "## Peak resident memory during the update")
    assert [row[:2] for row in summary] == [["tiny", "grad ckpt off"], ["tiny", "grad ckpt on"]]
    for _, _, ours, trl, ratio in summary:
        assert float(ours) > 0
        assert float(trl) > 0
        assert float(ratio) == pytest.approx(float(ours) / float(trl), abs=0.01)

    detail = _table(text, "## Every figure")
    assert [(row[1], row[2]) for row in detail] == [
        ("grad ckpt off", "ours"), ("grad ckpt off", "trl"),
        ("grad ckpt on", "ours"), ("grad ckpt on", "trl")]
    losses = {}
    for row in detail:
        start, peak, above, params, grads, optimizer = (float(v) for v in row[3:9])
        assert peak >= start > 0
        assert above == pytest.approx(peak - start, abs=1)  # each rounded to the MiB
        assert grads <= params  # every parameter trains here (full fine-tuning)
        assert optimizer >= 0
        assert row[11] == "-"  # no CUDA figure on the CPU
        assert float(row[12]) > 0
        losses[(row[1], row[2])] = float(row[13])
        # both trainers checkpoint the tiny model's 2 layers exactly when asked to
        assert int(row[14]) == (2 if row[1] == "grad ckpt on" else 0)
    # the same batch, weights and optimizer: both trainers report the same loss
    for setting in ("grad ckpt off", "grad ckpt on"):
        assert losses[(setting, "ours")] == pytest.approx(losses[(setting, "trl")], rel=1e-3)
