"""The step-time benchmark against TRL (``benchmarks/step_time_vs_trl.py``): its statistics,
fairness checks and memory probe on hand-built inputs, and its CPU path end to end with tiny
settings. TRL is a benchmark-only extra, so the module skips without it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from script_loader import load_script

pytest.importorskip("trl")
# transformers' deprecation notices for the gradient_checkpointing options TRL itself uses.
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

bench = load_script("benchmarks/step_time_vs_trl.py")

# Tiny settings: the project's default tiny shape, 2 prompts x 2 completions, 4 new tokens.
TINY_ARGS = [
    "--workload", "cpu-tiny", "--steps", "2", "--block", "1", "--num-prompts", "2",
    "--group-size", "2", "--max-new-tokens", "4", "--prompt-tokens", "8", "--micro-batch", "2",
    "--hidden-size", "64", "--num-layers", "2", "--num-heads", "4", "--num-kv-heads", "2",
    "--intermediate-size", "128",
]


def _sample(seconds: float, begin: float = 0.0, **phases: float) -> object:
    values = {"generate": 0.0, "score": 0.0, "update": 0.0, **phases}
    return bench.StepSample(begin=begin, seconds=seconds, cpu_seconds=seconds,
                            loop_seconds=seconds, peak_mib=1.0, mean_completion_length=4.0,
                            **values)


# ---------------------------------------------------------------------------------- pure parts
def test_parity_reward_is_the_fraction_of_odd_ids():
    # [1, 2, 3]: two odd ids of three; [2, 4]: none; []: defined as 0 (no division by zero).
    rewards = bench.parity_reward(["p"] * 3, ["a", "b", ""], completion_ids=[[1, 2, 3], [2, 4], []])
    assert rewards == pytest.approx([2 / 3, 0.0, 0.0], abs=1e-12)
    with pytest.raises(ValueError, match="needs completion_ids"):
        bench.parity_reward(["p"], ["a"])


def test_median_and_quartiles_skip_the_warmup_step():
    # Steps 2..5 are [1, 3, 2, 4] (the 100 s first step is warm-up): median (2 + 3) / 2 = 2.5;
    # sorted [1, 2, 3, 4], p25 at position 0.75 -> 1.75, p75 at position 2.25 -> 3.25.
    result = bench.TrainerResult("t", "s", [_sample(s) for s in (100.0, 1.0, 3.0, 2.0, 4.0)])
    assert result.median("seconds") == pytest.approx(2.5, abs=1e-12)
    assert result.quartiles() == pytest.approx((1.75, 3.25), abs=1e-12)
    assert result.minimum() == 1.0
    assert math.isnan(bench.TrainerResult("t", "s", [_sample(5.0)]).median("seconds"))


def test_quartiles_match_numpy_on_random_samples():
    rng = np.random.default_rng(0)
    for size in (2, 3, 7, 20):
        values = rng.exponential(size=size)
        result = bench.TrainerResult("t", "s", [_sample(float(v)) for v in values])
        expected = np.percentile(values[1:], [25, 75])
        assert result.quartiles() == pytest.approx(tuple(expected), abs=1e-12)
        assert result.median("seconds") == pytest.approx(float(np.median(values[1:])), abs=1e-12)


def test_other_is_the_step_minus_its_phases():
    sample = _sample(10.0, generate=6.0, score=0.5, update=3.0)
    assert sample.other == pytest.approx(0.5, abs=1e-12)


class _AddsBos:
    """A tokenizer stub: one id per character, plus a BOS id unless told not to."""

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        ids = [ord(c) for c in text]
        return {"input_ids": ([1] if add_special_tokens else []) + ids}

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


def test_rows_have_exactly_the_requested_prompt_length():
    from mtgrpo.models import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    rows = bench.make_rows(tokenizer, 12, 48, seed=3)
    assert len({r["prompt"] for r in rows}) == 12
    assert all(len(tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]) == 48
               for r in rows)
    assert rows == bench.make_rows(tokenizer, 12, 48, seed=3)
    with pytest.raises(ValueError, match="adds no special tokens"):
        bench.make_rows(_AddsBos(), 2, 16, seed=0)


def _settings(**changes: object) -> dict[str, object]:
    base = {"top_k": 0, "temperature": 1.0, "stop_ids": [256, 258], "min_p": None}
    return {**base, **changes}


def test_check_same_workload_names_every_difference():
    bench.check_same_workload(_settings(), _settings())
    with pytest.raises(ValueError, match=r"top_k: ours 0, TRL 50; min_p: ours None, TRL 0.05"):
        bench.check_same_workload(_settings(), _settings(top_k=50, min_p=0.05))
    # An engine that keeps its stop ids private reports None: not compared.
    bench.check_same_workload(_settings(stop_ids=None), _settings())
    with pytest.raises(ValueError, match="stop_ids"):
        bench.check_same_workload(_settings(stop_ids=[258]), _settings())
    with pytest.raises(ValueError, match="different fields"):
        bench.check_same_workload(_settings(), {**_settings(), "beta": 0.0})


def test_config_errors_say_the_rule_and_the_fix():
    with pytest.raises(ValueError, match="at least 2 steps"):
        bench.config_from_args([*TINY_ARGS, "--steps", "1"])
    with pytest.raises(ValueError, match="does not divide the 4 completions"):
        bench.config_from_args([*TINY_ARGS, "--micro-batch", "3"])
    with pytest.raises(ValueError, match="--threads 0 must be >= 1"):
        bench.config_from_args([*TINY_ARGS, "--threads", "0"])
    with pytest.raises(ValueError, match="8-token prompts plus 1020 new tokens exceed"):
        bench.config_from_args([*TINY_ARGS, "--max-new-tokens", "1020"])
    with pytest.raises(ValueError, match="at least 2 completions"):
        bench.config_from_args([*TINY_ARGS, "--group-size", "1"])
    with pytest.raises(ValueError, match="unknown benchmark workload 'cpu'; valid names"):
        bench.config_from_args(["--workload", "cpu"])
    with pytest.raises(ValueError, match=r"--ours-backend 'nope'.*valid names: .*hf"):
        bench.run_benchmark(bench.config_from_args([*TINY_ARGS, "--ours-backend", "nope"])[0])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error is for machines without CUDA")
def test_gpu_workload_refused_without_cuda():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        bench.config_from_args(["--workload", "gpu-qwen0.5b"])


def test_memory_probe_sees_a_step_allocation():
    probe = bench.MemoryProbe(torch.device("cpu"))
    if not probe.rss_resettable:
        pytest.skip("/proc/self/clear_refs is not writable here")
    import mmap

    probe.start()
    # 64 MiB of fresh anonymous pages, every page written. (Not a tensor: the C allocator may
    # serve a tensor from memory an earlier test freed but left resident, so RSS need not rise.)
    block = mmap.mmap(-1, 64 * 2**20)
    for offset in range(0, len(block), mmap.PAGESIZE):
        block[offset] = 1
    block.close()
    # The peak RSS rose by the 64 MiB block even though it is freed before stop().
    assert probe.stop() >= 60


def test_resident_counts_parameters_and_optimizer_state():
    # 10x10 weight + 10 bias = 110 floats; after one AdamW step, exp_avg and exp_avg_sq add 220
    # floats and a scalar step per parameter (2 tensors).
    layer = torch.nn.Linear(10, 10)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.1)
    layer(torch.ones(1, 10)).sum().backward()
    optimizer.step()
    step_bytes = sum(s["step"].numel() * s["step"].element_size()
                     for s in optimizer.state.values())
    expected = (330 * 4 + step_bytes) / 2**20
    assert bench.resident_mib(layer, optimizer) == pytest.approx(expected, rel=1e-12)


def test_a_run_that_lost_the_fast_paths_prints_no_ratio():
    fast = {"generation/backend": "static", "policy/padding_free": True}
    bench.check_fast_paths(fast, "auto")
    bench.check_fast_paths({"generation/backend": "hf", "policy/padding_free": True}, "hf")
    with pytest.raises(RuntimeError, match=r"would not measure what its ratio claims: our "
                                           r"trainer uses generation backend 'hf' instead of "
                                           r"'static'.*requirements/lock\.txt"):
        bench.check_fast_paths({**fast, "generation/backend": "hf"}, "auto")
    with pytest.raises(RuntimeError, match=r"a padded update \(log-prob path 'chunked_head'\)"):
        bench.check_fast_paths({**fast, "policy/padding_free": False,
                                "policy/logprob_path": "chunked_head"}, "auto")
    with pytest.raises(RuntimeError, match=r"backend 'static' instead of 'hf'"):
        bench.check_fast_paths(fast, "hf")


def test_the_benchmark_refuses_before_timing_when_auto_falls_back(monkeypatch):
    from mtgrpo.rollout import selection

    monkeypatch.setattr(selection, "_auto_backend", lambda model: "hf")  # as a broken release would
    config, _ = bench.config_from_args(TINY_ARGS)
    with pytest.raises(RuntimeError, match="generation backend 'hf' instead of 'static'"):
        bench.run_benchmark(config)


# ---------------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def tiny_report():
    # bf16 auto forced on for our default row (a bf16 CPU, and no minimum width for this
    # 64-wide model), so that --ours-fp32 adds its row on any CPU
    config, _ = bench.config_from_args([*TINY_ARGS, "--trl-defaults", "--trl-bf16",
                                        "--ours-fp32", "--ours-padded"])
    import mtgrpo.models.precision as precision

    original = precision.cpu_bf16_feature, precision.CPU_BF16_MIN_WIDTH, bench.build_ours
    precision.cpu_bf16_feature = lambda: "avx512_bf16"
    precision.CPU_BF16_MIN_WIDTH = 0
    updates = []  # each of our trainers' update as its run record states it

    def build_ours(*args, **kwargs):
        trainer = original[2](*args, **kwargs)
        updates.append(trainer.run_record()["policy/padding_free"])
        return trainer

    bench.build_ours = build_ours
    try:
        report = bench.run_benchmark(config)
    finally:
        precision.cpu_bf16_feature, precision.CPU_BF16_MIN_WIDTH, bench.build_ours = original
    report.padding_free = updates
    return report


def test_every_trainer_runs_and_reports_every_step(tiny_report):
    ours, ours_fp32, ours_padded, trl, trl_bf16, trl_defaults = tiny_report.results
    assert ours.trainer == "mtgrpo (static)"
    assert ours.settings == ("fp32 weights, bf16 autocast, bfloat16 generation, "
                             "no grad ckpt")
    assert ours_fp32.trainer == "mtgrpo (static, bf16 off)"
    assert ours_fp32.settings == "fp32 weights, no autocast, no grad ckpt"
    assert ours_padded.trainer == "mtgrpo (static, padded update)"
    assert ours_padded.settings == ours.settings
    # ours, ours-fp32 padding-free; the --ours-padded row's trainer really runs padded
    assert tiny_report.padding_free == [True, True, False]
    assert trl.trainer.endswith("(fp32)")
    assert trl_bf16.trainer.endswith("(bf16)")
    assert trl_bf16.settings == "fp32 weights, bf16 autocast, no grad ckpt"
    assert "(defaults)" in trl_defaults.trainer
    assert "grad ckpt" in trl_defaults.settings
    for result in tiny_report.results:
        assert len(result.samples) == 2
        for sample in result.samples:
            assert min(sample.seconds, sample.cpu_seconds, sample.generate, sample.update) > 0
            assert sample.generate + sample.score + sample.update <= sample.seconds + 1e-6
            assert sample.loop_seconds >= sample.seconds
            assert 1 <= sample.mean_completion_length <= 4
        assert result.resident_mib > 0
    # Blocks of one step, ours first: ours 1, ours-fp32 1, ours-padded 1, TRL 1, ours 2, ...;
    # then TRL bf16 and TRL defaults, each alone.
    order = [ours.samples[0], ours_fp32.samples[0], ours_padded.samples[0], trl.samples[0],
             ours.samples[1], ours_fp32.samples[1], ours_padded.samples[1], trl.samples[1],
             *trl_bf16.samples, *trl_defaults.samples]
    assert [s.begin for s in order] == sorted(s.begin for s in order)


def test_report_table_has_one_row_per_trainer_and_the_ratio(tiny_report):
    text = bench.markdown_report(tiny_report)
    rows = [line for line in text.splitlines() if line.startswith("| cpu-tiny |")]
    assert len(rows) == 6
    ours, trl = tiny_report.results[0], tiny_report.results[3]
    assert float(rows[3].split("|")[5]) == pytest.approx(trl.minimum(), abs=6e-4)
    *_, wall_ratio, cpu_ratio, _ = rows[3].split("|")
    assert float(wall_ratio) == pytest.approx(trl.median("seconds") / ours.median("seconds"),
                                              abs=0.006)
    assert float(cpu_ratio) == pytest.approx(
        trl.median("cpu_seconds") / ours.median("cpu_seconds"), abs=0.006)
    assert rows[0].split("|")[-3:-1] == [" - ", " - "]
    best = bench.best_trl(tiny_report.results)
    assert best is min(tiny_report.results[3:], key=lambda r: r.median("seconds"))
    ratio = best.median("seconds") / ours.median("seconds")
    assert f"TRL's fastest setting measured: {best.trainer}" in text
    assert f"**TRL / ours: {ratio:.2f}x**" in text
    assert "Command: `python benchmarks/step_time_vs_trl.py --workload cpu-tiny" in text


def test_main_prints_and_appends_the_report(tiny_report, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "run_benchmark", lambda config: tiny_report)
    out = tmp_path / "results" / "bench.md"
    first = bench.main([*TINY_ARGS, "--out", str(out)])
    bench.main([*TINY_ARGS, "--out", str(out)])
    assert first in capsys.readouterr().out
    assert out.read_text() == (first + "\n") * 2
