"""Where a training step's time goes: ``torch.profiler`` over one step of our trainer and of TRL's
on a workload of ``benchmarks/step_time_vs_trl.py``, phase by phase.

    python benchmarks/profile_step.py --workload gpu-qwen0.5b              # ours, ours-padded, trl
    python benchmarks/profile_step.py --workload gpu-qwen0.5b --trainers ours --trace $OUT
    python benchmarks/profile_step.py --workload cpu-tiny --num-layers 24 --hidden-size 64

The step-time benchmark says how long each trainer's phases take; this says why. Each trainer
(``--trainers``: ``ours``, our trainer at its defaults; ``ours-padded``, ours with
``padding_free`` off; ``ours-fp32``, ours with ``bf16`` off (float32 throughout, as TRL runs
when the workload's weights are float32: the matched row for operator counts, where ``ours``
may run bf16 autocast and a bfloat16 generation replica on a CPU with ``avx512_bf16``);
``trl``, TRL 1.16 at its fastest setting, as the step-time benchmark
builds them, from one model built under the same seed) runs ``--warmup`` steps unprofiled (CUDA
graph capture, allocator growth, the optimizer's state), then one step under the profiler (host
activity and, on CUDA, the device's). Each phase is marked with ``record_function``: ours
``generate+score`` (``sampler.build``) and ``update`` (``updater.update``); TRL's
``generate+score`` (``_generate_and_score_completions``), the rest of its step being the update.
Per trainer and phase the report gives the wall time, the aten operators the host dispatched
(outermost ones, on every thread, backward included), the device kernels launched and the
host-device synchronisations (``aten::_local_scalar_dense``: ``.item()``, ``int(t)``, ``bool(t)``
on a device tensor; ``cudaStreamSynchronize``, ``cudaDeviceSynchronize``), then the operators
with the largest self time on the device (CUDA) or the host (CPU) over the whole step. A step
that dispatches many more operators or synchronises often is bound by the host, not the device.

``--trace DIR`` also writes each trainer's Chrome trace (``chrome://tracing``, Perfetto).
Times under the profiler are longer than without it; compare trainers within one report.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import shlex
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

_HERE = Path(__file__).resolve().parent


def _load_step_time() -> Any:
    name = "step_time_vs_trl"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _HERE / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


bench = _load_step_time()

TRAINERS = ("ours", "ours-padded", "trl", "ours-fp32")
DEFAULT_TRAINERS = ("ours", "ours-padded", "trl")
PHASES = ("generate+score", "update")
# Host-side calls that wait for the device.
SYNC_EVENTS = frozenset({"aten::_local_scalar_dense", "cudaStreamSynchronize",
                         "cudaDeviceSynchronize", "cudaEventSynchronize"})
LAUNCH_EVENTS = frozenset({"cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC",
                           "cuLaunchKernelEx", "cudaGraphLaunch"})


@dataclass
class PhaseCounts:
    """What the host did during one phase (or the whole step): seconds and counts."""

    seconds: float = 0.0
    ops: int = 0  # outermost aten operators, every thread
    launches: int = 0  # kernel (and CUDA graph) launches
    syncs: int = 0  # host-device synchronisations


@dataclass
class Profiled:
    """One trainer's profiled step."""

    trainer: str
    step_seconds: float
    phases: dict[str, PhaseCounts]
    whole: PhaseCounts
    peak_mib: float
    device_table: str
    host_table: str
    update_ops: Counter[str] = field(default_factory=Counter)  # outermost aten ops by name
    trace: Path | None = None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ProfileConfig:
    """What one run profiles; validated before any model is built."""

    bench: Any  # step_time_vs_trl.BenchConfig (its workload, seed, learning rate, threads)
    trainers: tuple[str, ...]
    warmup: int = 2
    rows: int = 25
    trace: Path | None = None
    command: str = ""

    def __post_init__(self) -> None:
        unknown = [t for t in self.trainers if t not in TRAINERS]
        if unknown or not self.trainers:
            raise ValueError(f"--trainers {','.join(self.trainers)!r}: pick from "
                             f"{', '.join(TRAINERS)} (comma-separated)")
        if self.warmup < 1:
            raise ValueError(f"--warmup {self.warmup} must be >= 1: the first step captures "
                             "CUDA graphs and builds the optimizer's state")
        if self.rows < 1:
            raise ValueError(f"--rows {self.rows} must be >= 1")
        if self.trace is not None and self.trace.exists() and not self.trace.is_dir():
            raise ValueError(f"--trace {self.trace} is a file; give a folder for the traces")


# ---------------------------------------------------------------------------------- counting
def _outermost(events: Sequence[Any]) -> Iterator[Any]:
    """aten events whose parent is not an aten event (``aten::linear``, not its ``addmm``)."""
    for event in events:
        if not event.name.startswith("aten::"):
            continue
        parent = event.cpu_parent
        if parent is None or not parent.name.startswith("aten::"):
            yield event


def count_events(events: Sequence[Any], start_us: float, end_us: float) -> PhaseCounts:
    """Counts of the host events that begin within ``[start_us, end_us]`` (any thread)."""
    inside = [e for e in events if start_us <= e.time_range.start <= end_us]
    return PhaseCounts(
        seconds=(end_us - start_us) / 1e6,
        ops=sum(1 for _ in _outermost(inside)),
        launches=sum(1 for e in inside if e.name in LAUNCH_EVENTS),
        syncs=sum(1 for e in inside if e.name in SYNC_EVENTS),
    )


def _ranges(events: Sequence[Any]) -> dict[str, list[tuple[float, float]]]:
    ranges: dict[str, list[tuple[float, float]]] = {}
    for event in events:
        if event.name in (*PHASES, "step"):
            ranges.setdefault(event.name, []).append((event.time_range.start,
                                                      event.time_range.end))
    if "step" not in ranges:
        raise RuntimeError("the profiled step recorded no 'step' range")
    return ranges


def ops_by_name(events: Sequence[Any], phase: str) -> Counter[str]:
    """Outermost aten operators by name within ``phase`` (``update`` without its own range:
    the step minus ``generate+score``, as for TRL)."""
    ranges = _ranges(events)

    def within(spans: list[tuple[float, float]]) -> Counter[str]:
        return Counter(e.name for e in _outermost(
            [e for e in events if any(a <= e.time_range.start <= b for a, b in spans)]))

    if phase in ranges:
        return within(ranges[phase])
    counts = within(ranges["step"])
    counts.subtract(within(ranges.get("generate+score", [])))
    return +counts


def phase_counts(events: Sequence[Any]) -> tuple[dict[str, PhaseCounts], PhaseCounts]:
    """Per-phase counts from the ``record_function`` ranges, and the step's (``step``); without
    an ``update`` range (TRL) the update is the step minus ``generate+score``."""
    ranges = _ranges(events)
    whole = count_events(events, *ranges["step"][0])
    phases = {}
    for name in PHASES:
        counts = PhaseCounts()
        for start, end in ranges.get(name, []):
            part = count_events(events, start, end)
            counts.seconds += part.seconds
            counts.ops += part.ops
            counts.launches += part.launches
            counts.syncs += part.syncs
        phases[name] = counts
    if "update" not in ranges:  # TRL: the update is the step minus generation and scoring
        generate = phases["generate+score"]
        phases["update"] = PhaseCounts(
            seconds=whole.seconds - generate.seconds, ops=whole.ops - generate.ops,
            launches=whole.launches - generate.launches, syncs=whole.syncs - generate.syncs)
    return phases, whole


# ---------------------------------------------------------------------------------- profiling
@contextmanager
def _labelled(obj: Any, method: str, label: str) -> Iterator[None]:
    """Wrap ``obj.method`` (an instance attribute, measurement only) in ``record_function``."""
    original = getattr(obj, method)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with record_function(label):
            return original(*args, **kwargs)

    setattr(obj, method, wrapped)
    try:
        yield
    finally:
        setattr(obj, method, original)


def _activities(device: torch.device) -> list[ProfilerActivity]:
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])


def _result(name: str, prof: Any, seconds: float, peak_mib: float,
            config: ProfileConfig, device: torch.device) -> Profiled:
    """One trainer's :class:`Profiled` from its finished profiler (tables, counts, trace)."""
    events = prof.events()
    phases, whole = phase_counts(events)
    averages = prof.key_averages()

    def table(sort_by: str) -> str:
        return averages.table(sort_by=sort_by, row_limit=config.rows, max_name_column_width=60)

    trace = None
    if config.trace is not None:
        config.trace.mkdir(parents=True, exist_ok=True)
        trace = config.trace / f"trace-{name}.json"
        prof.export_chrome_trace(str(trace))
    return Profiled(name, seconds, phases, whole, peak_mib,
                    table("self_cuda_time_total") if device.type == "cuda" else "",
                    table("self_cpu_time_total"), ops_by_name(events, "update"), trace)


@contextmanager
def _step_profile(device: torch.device, config: ProfileConfig,
                  name: str) -> Iterator[list[Profiled]]:
    """Profile the body as one ``step`` range, with its wall time and peak memory; the
    :class:`Profiled` is appended to the yielded list when the body ends."""
    out: list[Profiled] = []
    probe = bench.MemoryProbe(device)
    bench._sync(device)
    probe.start()
    with profile(activities=_activities(device)) as prof:
        begin = time.perf_counter()
        with record_function("step"):
            yield out
            bench._sync(device)
        seconds = time.perf_counter() - begin
    out.append(_result(name, prof, seconds, probe.stop(), config, device))


def _profiled_step(run_step: Callable[[], None], device: torch.device, config: ProfileConfig,
                   name: str) -> Profiled:
    with _step_profile(device, config, name) as out:
        run_step()
    return out[0]


def profile_ours(base: torch.nn.Module, tokenizer: Any, rows: list[dict[str, str]],
                 config: ProfileConfig, device: torch.device, tmp: Path, *,
                 name: str) -> Profiled:
    bench_config = replace(config.bench, steps=config.warmup + 1)
    padded = name == "ours-padded"
    trainer = bench.build_ours(copy.deepcopy(base), tokenizer, rows, bench_config, tmp / name,
                               padding_free=not padded,
                               bf16=False if name == "ours-fp32" else None)
    record = trainer.run_record()
    if name == "ours-fp32" and record.get("precision/bf16"):
        raise RuntimeError("ours-fp32: the trainer resolved bf16 on; nothing matched to profile")
    if bool(record.get("policy/padding_free")) == padded:
        raise RuntimeError(f"{name}: the trainer's update is "
                           f"{'padding-free' if record.get('policy/padding_free') else 'padded'}"
                           f" ({record.get('policy/logprob_path')!r}), not what {name} profiles")
    for _ in range(config.warmup):
        trainer.training_step()
    bench._sync(device)
    with _labelled(trainer.sampler, "build", "generate+score"), \
            _labelled(trainer.updater, "update", "update"):
        result = _profiled_step(trainer.training_step, device, config, name)
    result.notes.append(f"backend {record.get('generation/backend')}, log-prob path "
                        f"{record.get('policy/logprob_path')}, padding-free "
                        f"{record.get('policy/padding_free')}, bf16 {record.get('precision/bf16')}")
    del trainer
    bench._free_memory(device)
    return result


class _TRLProfiler(bench.TrainerCallback):
    """Profiles TRL's step ``warmup + 1`` (``on_step_begin`` -> ``on_step_end``)."""

    def __init__(self, config: ProfileConfig, device: torch.device) -> None:
        self.config = config
        self.device = device
        self.result: Profiled | None = None
        self._open: tuple[ExitStack, list[Profiled]] | None = None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step != self.config.warmup:
            return
        stack = ExitStack()
        self._open = (stack, stack.enter_context(_step_profile(self.device, self.config, "trl")))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._open is None:
            return
        stack, out = self._open
        self._open = None
        stack.close()
        self.result = out[0]


def profile_trl(base: torch.nn.Module, tokenizer: Any, rows: list[dict[str, str]],
                config: ProfileConfig, device: torch.device, tmp: Path) -> Profiled:
    bench_config = replace(config.bench, steps=config.warmup + 1)
    w = bench_config.workload
    result = bench.TrainerResult("trl", "")
    timer = bench.TRLStepTimer(result, bench.MemoryProbe(device), device, block=1)
    trl = bench.build_trl(copy.deepcopy(base), tokenizer, rows, bench_config, tmp / "trl",
                          defaults=False, timer=timer, bf16=w.bf16)
    profiler = _TRLProfiler(config, device)
    trl.add_callback(profiler)
    with _labelled(trl, "_generate_and_score_completions", "generate+score"):
        trl.train()
    bench._reset_accelerate()
    if profiler.result is None:
        raise RuntimeError(f"TRL stopped before its step {config.warmup + 1}; nothing profiled")
    profiler.result.notes.append(
        f"TRL {bench._trl_version()}, bf16 {w.bf16}, no gradient checkpointing")
    del trl
    bench._free_memory(device)
    return profiler.result


def run_profile(config: ProfileConfig) -> list[Profiled]:
    """Build the workload once and profile each trainer's step (module docstring)."""
    device = bench.bench_device(config.bench)
    base, tokenizer, rows = bench.build_workload(config.bench)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        for name in config.trainers:
            if name == "trl":
                results.append(profile_trl(base, tokenizer, rows, config, device, Path(tmp)))
            else:
                results.append(profile_ours(base, tokenizer, rows, config, device, Path(tmp),
                                            name=name))
    return results


# ---------------------------------------------------------------------------------- output
def markdown_report(config: ProfileConfig, results: Sequence[Profiled]) -> str:
    """The counts table, then each trainer's top operators."""
    w = config.bench.workload
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    env = bench.environment(device)
    lines = [
        f"### {w.name}: one profiled step per trainer after {config.warmup} warm-up step(s)", "",
        f"Command: `{config.command}`", "",
        "Environment: " + "; ".join(f"{k}: {v}" for k, v in env.items()), "",
        f"Workload: {w.arch} shape hidden {w.hidden_size}, {w.num_layers} layers, vocab "
        f"{w.vocab_size or 'tokenizer (259)'}, {'bf16' if w.bf16 else 'fp32'} weights; "
        f"{w.num_prompts} prompts x {w.group_size} completions, {w.prompt_tokens}-token "
        f"prompts, up to {w.max_new_tokens} new tokens, micro-batch {w.micro_batch}.", "",
        "| trainer | phase | s (profiled) | aten ops | kernel launches | host syncs | "
        "peak step MiB |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        for phase in (*PHASES, "step"):
            counts = r.whole if phase == "step" else r.phases[phase]
            peak = f"{r.peak_mib:.0f}" if phase == "step" and r.peak_mib == r.peak_mib else ""
            lines.append(f"| {r.trainer} | {phase} | {counts.seconds:.3f} | {counts.ops} | "
                         f"{counts.launches} | {counts.syncs} | {peak} |")
    lines.append("")
    names = sorted({n for r in results for n in r.update_ops},
                   key=lambda n: -max(r.update_ops[n] for r in results))[: config.rows]
    lines += ["The update's most dispatched operators (outermost aten ops, calls):", "",
              "| operator | " + " | ".join(r.trainer for r in results) + " |",
              "|---|" + "---:|" * len(results)]
    lines += [f"| `{n}` | " + " | ".join(str(r.update_ops[n]) for r in results) + " |"
              for n in names]
    lines.append("")
    for r in results:
        lines += [f"#### {r.trainer}", ""]
        lines += [f"- {note}" for note in r.notes]
        if r.trace is not None:
            lines.append(f"- trace: `{r.trace}`")
        lines.append("")
        if r.device_table:
            lines += ["Top operators by self device time:", "", "```", r.device_table.rstrip(),
                      "```", ""]
        lines += ["Top operators by self host time:", "", "```", r.host_table.rstrip(), "```",
                  ""]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="torch.profiler over one training step of mtgrpo and of TRL.")
    parser.add_argument("--workload", default="cpu-tiny",
                        help=f"one of: {', '.join(bench.WORKLOADS.names())}")
    parser.add_argument("--trainers", default=",".join(DEFAULT_TRAINERS),
                        help=f"comma-separated, from: {', '.join(TRAINERS)}")
    parser.add_argument("--warmup", type=int, default=2, help="unprofiled steps first")
    parser.add_argument("--rows", type=int, default=25, help="operators per top table")
    parser.add_argument("--trace", type=Path, default=None,
                        help="folder for each trainer's Chrome trace")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--learning-rate", type=float, default=1e-6)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--out", type=Path, default=None,
                        help="append the Markdown report to this file")
    bench.add_shape_options(parser)
    return parser


def config_from_args(argv: Sequence[str]) -> tuple[ProfileConfig, Path | None]:
    """The validated :class:`ProfileConfig` of a command line, and its ``--out`` path."""
    options = _parser().parse_args(list(argv))
    bench_config = bench.BenchConfig(
        workload=bench.shaped_workload(options), steps=max(options.warmup, 1) + 1,
        learning_rate=options.learning_rate, seed=options.seed, threads=options.threads)
    trainers = tuple(t.strip() for t in options.trainers.split(",") if t.strip())
    return ProfileConfig(
        bench=bench_config, trainers=trainers, warmup=options.warmup, rows=options.rows,
        trace=options.trace,
        command=shlex.join(["python", "benchmarks/profile_step.py", *argv]),
    ), options.out


def main(argv: Sequence[str] | None = None) -> str:
    """Run the profile, print the Markdown report (and append it to ``--out``); return it."""
    argv = list(sys.argv[1:] if argv is None else argv)
    config, out = config_from_args(argv)
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    text = markdown_report(config, run_profile(config))
    bench.emit(text, out)
    return text


if __name__ == "__main__":
    main()
