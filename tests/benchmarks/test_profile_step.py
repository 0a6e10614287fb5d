"""The step profiler (``benchmarks/profile_step.py``): its counting on hand-built profiler
events, its bad-input checks, and one profiled step of each trainer end to end on a tiny model
on the CPU. TRL is a benchmark-only extra, so the module skips without it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from script_loader import load_script

pytest.importorskip("trl")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

profiler = load_script("benchmarks/profile_step.py")

TINY_ARGS = [
    "--workload", "cpu-tiny", "--num-prompts", "2", "--group-size", "2", "--max-new-tokens",
    "4", "--prompt-tokens", "8", "--micro-batch", "2", "--hidden-size", "64", "--num-layers",
    "2", "--num-heads", "4", "--num-kv-heads", "2", "--intermediate-size", "128",
    "--warmup", "1", "--rows", "5",
]


def _event(name: str, start: float, end: float, parent: object = None) -> SimpleNamespace:
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end),
                           cpu_parent=parent)


def _events() -> list[SimpleNamespace]:
    """A step [0, 100] us: generate+score [0, 40], update [50, 100]."""
    linear = _event("aten::linear", 10, 20)
    update_linear = _event("aten::linear", 60, 70)
    return [
        _event("step", 0, 100),
        _event("generate+score", 0, 40),
        linear, _event("aten::addmm", 11, 19, parent=linear),  # nested: not counted
        _event("cudaLaunchKernel", 12, 13, parent=linear),
        _event("aten::_local_scalar_dense", 30, 31),
        _event("update", 50, 100),
        update_linear, _event("aten::mm", 61, 69, parent=update_linear),
        _event("aten::mul", 75, 76),
        _event("aten::mul", 80, 81, parent=_event("autograd::engine", 79, 90)),  # backward thread
        _event("cudaLaunchKernel", 76, 77),
        _event("cudaGraphLaunch", 78, 79),
        _event("cudaStreamSynchronize", 95, 96),
        _event("aten::_local_scalar_dense", 97, 98),
    ]


def test_phase_counts_count_outermost_ops_launches_and_syncs_per_phase():
    phases, whole = profiler.phase_counts(_events())
    generate, update = phases["generate+score"], phases["update"]
    # generate: linear (addmm nested), one launch, one scalar read
    assert (generate.ops, generate.launches, generate.syncs) == (2, 1, 1)
    assert generate.seconds == pytest.approx(40e-6)
    # update: linear, mul, mul under a non-aten parent; a launch and a graph launch; 2 syncs
    assert (update.ops, update.launches, update.syncs) == (4, 2, 2)
    assert (whole.ops, whole.launches, whole.syncs) == (6, 3, 3)
    assert whole.seconds == pytest.approx(100e-6)
    # TRL has no update range: the step minus generate+score, here the same counts
    trl_phases, _ = profiler.phase_counts([e for e in _events() if e.name != "update"])
    derived = trl_phases["update"]
    assert (derived.ops, derived.launches, derived.syncs) == (4, 2, 2)
    assert derived.seconds == pytest.approx(60e-6)


def test_ops_by_name_of_a_phase_and_of_the_step_without_its_range():
    events = _events()
    update = {"aten::linear": 1, "aten::mul": 2, "aten::_local_scalar_dense": 1}
    assert profiler.ops_by_name(events, "update") == update
    assert profiler.ops_by_name(events, "generate+score") == {
        "aten::linear": 1, "aten::_local_scalar_dense": 1}
    # TRL has no update range: the step minus generate+score, here the same operators
    no_update = [e for e in events if e.name != "update"]
    assert profiler.ops_by_name(no_update, "update") == update


def test_a_profile_without_a_step_range_is_refused():
    with pytest.raises(RuntimeError, match="no 'step' range"):
        profiler.phase_counts([_event("update", 0, 1)])


@pytest.mark.parametrize(("extra", "message"), [
    (["--trainers", "ours,vllm"], "pick from ours, ours-padded, trl"),
    (["--trainers", ","], "pick from"),
    (["--warmup", "0"], "--warmup 0 must be >= 1"),
    (["--rows", "0"], "--rows 0 must be >= 1"),
])
def test_bad_input_is_refused_before_any_model_is_built(extra, message):
    with pytest.raises(ValueError, match=message):
        profiler.config_from_args([*TINY_ARGS, *extra])


def test_a_trace_path_that_is_a_file_is_refused(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text("{}")
    with pytest.raises(ValueError, match="is a file"):
        profiler.config_from_args([*TINY_ARGS, "--trace", str(path)])


def test_every_trainer_is_profiled_end_to_end(tmp_path, capsys):
    out = tmp_path / "profile.md"
    text = profiler.main([*TINY_ARGS, "--trace", str(tmp_path / "traces"), "--out", str(out)])
    assert out.read_text() == text + "\n"
    rows = [line.split("|")[1:-1] for line in text.splitlines()
            if line.startswith(("| ours", "| trl"))]
    counts = [r for r in rows if r[1].strip() in ("generate+score", "update", "step")]
    trainers, phases = ("ours", "ours-padded", "trl"), ("generate+score", "update", "step")
    assert [(r[0].strip(), r[1].strip()) for r in counts] == [
        (t, p) for t in trainers for p in phases]
    by_key = {(r[0].strip(), r[1].strip()): r for r in counts}
    for trainer in ("ours", "ours-padded", "trl"):
        step_ops = int(by_key[(trainer, "step")][3])
        parts = [int(by_key[(trainer, p)][3]) for p in ("generate+score", "update")]
        assert min(parts) > 0
        assert sum(parts) <= step_ops  # the rest: weighting, logging, the prompt fetch
    # the padded trainer runs padded, ours padding-free (as their run records say)
    assert "padding-free False" in text.split("#### ours-padded")[1].split("####")[0]
    assert "padding-free True" in text.split("#### ours\n")[1].split("####")[0]
    assert "The update's most dispatched operators" in text
    assert "aten::mm" in text
    for trainer in ("ours", "ours-padded", "trl"):
        assert (tmp_path / "traces" / f"trace-{trainer}.json").stat().st_size > 0
