"""Where one update's memory peak is: by phase, and by the tensors alive at the maximum.

    python benchmarks/update_memory_trace.py --model qwen2.5-0.5b --trainer ours --checkpointing on
    python benchmarks/update_memory_trace.py --model qwen2.5-0.5b --trainer trl --checkpointing on

Builds the same model, trainer and fixed batch as ``benchmarks/update_memory.py`` (one of its
``MODELS``), runs one warm-up update, then traces the next one twice:

1. **phases**: resident memory (``VmRSS``) sampled every 2 ms by a thread, each sample
   attributed to the phase running (``forward``; ``backward``, split at the output head's and
   the final norm's backward by module hooks; ``clip``; ``optimizer``), reported as the peak of
   each phase above the update's start (MiB);
2. **live tensors**: a ``TorchDispatchMode`` records every tensor of at least ``--min-mib``
   created during the update (by storage, freed with it) and, at the largest total, lists the
   biggest of them with the operator that made them and the phase. Views made during the update
   (``t``, ``slice``) of storage that existed before are listed too: read them as the
   parameters they look at, not as new memory.

The two differ in what they see: resident memory counts pages once written, live tensors
count allocations. See ``benchmarks/results/update_memory_cpu.md`` ("Where ours peaks").
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

_HERE = Path(__file__).resolve().parent


def _update_memory() -> Any:
    spec = importlib.util.spec_from_file_location("update_memory", _HERE / "update_memory.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("update_memory", module)
    spec.loader.exec_module(module)
    return module


def _rss_mib() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024
    return 0


class Phases:
    """The phase running now, and the peak resident memory seen in each."""

    def __init__(self) -> None:
        self.now = "other"
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _note(self, phase: str) -> None:
        self.peaks[phase] = max(self.peaks.get(phase, 0), _rss_mib())

    @contextlib.contextmanager
    def entered(self, name: str) -> Iterator[None]:
        """``name`` runs in the block: sampled at its start and end too, so a phase shorter
        than the sampling interval is still seen."""
        before, self.now = self.now, name
        self._note(name)
        try:
            yield
        finally:
            self._note(name)
            self.now = before

    def wrap(self, owner: Any, attribute: str, name: str) -> None:
        function = getattr(owner, attribute)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with self.entered(name):
                return function(*args, **kwargs)

        setattr(owner, attribute, wrapped)

    def label_backward(self, model: torch.nn.Module, names: tuple[str, ...]) -> None:
        for name, module in model.named_modules():
            if name in names:
                module.register_full_backward_pre_hook(
                    lambda *_, label=f"backward:{name}": setattr(self, "now", label))

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._note(self.now)
            time.sleep(0.002)

    @contextlib.contextmanager
    def sampling(self) -> Iterator[None]:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        try:
            yield
        finally:
            self._stop.set()
            self._thread.join()


class LiveTensors(torch.utils._python_dispatch.TorchDispatchMode):
    """Tensors of at least ``min_bytes`` made while active, and the biggest ones at the
    largest total (see the module docstring)."""

    def __init__(self, min_bytes: int, phase: Callable[[], str], top: int = 12) -> None:
        super().__init__()
        self.min_bytes, self.phase, self.top = min_bytes, phase, top
        self.live: dict[int, tuple[int, str, str]] = {}
        self.total = self.maximum = 0
        self.at_maximum: list[tuple[int, str, str]] = []

    def _release(self, key: int, size: int) -> None:
        if self.live.pop(key, None) is not None:
            self.total -= size

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in torch.utils._pytree.tree_flatten(out)[0]:
            if not isinstance(tensor, torch.Tensor) or tensor.is_meta:
                continue
            storage = tensor.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
            if size < self.min_bytes or key in self.live:
                continue
            self.live[key] = (size, str(func), self.phase())
            self.total += size
            weakref.finalize(storage, self._release, key, size)
        if self.total > self.maximum:
            self.maximum = self.total
            self.at_maximum = sorted(self.live.values(), reverse=True)[: self.top]
        return out


def trace(model_name: str, trainer: str, checkpointing: bool, min_mib: float = 1.0,
          seed: int = 0) -> dict[str, Any]:
    """Both traces of one update (module docstring) as a dict: ``start`` (MiB), ``phases``
    (peak above the start, MiB, by phase) and ``live`` (``maximum`` MiB and the biggest
    tensors then: ``(MiB, operator, phase)``)."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    from mtgrpo.models import build_tiny_tokenizer

    memory = _update_memory()
    bench = memory.bench
    workload = memory.MODELS.get(model_name)
    config = bench.BenchConfig(workload=workload, steps=2, seed=seed)
    device = bench.bench_device(config)
    tokenizer = build_tiny_tokenizer(model_max_length=workload.max_position_embeddings)
    model = bench.build_model(workload, tokenizer, seed).to(device)
    rows = bench.make_rows(tokenizer, 4 * workload.num_prompts, workload.prompt_tokens, seed)
    batch = memory.fixed_batch(workload, seed)
    update_type = memory.OursUpdate if trainer == "ours" else memory.TRLUpdate
    phases = Phases()
    with tempfile.TemporaryDirectory(prefix="bench-update-trace-") as tmp:
        update = update_type(model, tokenizer, rows, config, Path(tmp), checkpointing)
        if trainer == "ours":
            import mtgrpo.trainer.update as update_module

            updater = update.trainer.updater
            phases.wrap(updater, "_logps", "forward")
            phases.wrap(updater.accelerator, "backward", "backward")
            phases.wrap(updater.optimizer, "step", "optimizer")
            clip = update_module.clip_gradients
            update_module.clip_gradients = lambda *a, **k: _entered(phases, "clip", clip, a, k)
        else:
            hf = update.trainer
            phases.wrap(hf, "compute_loss", "forward")
            phases.wrap(hf.accelerator, "backward", "backward")
            phases.wrap(hf.optimizer, "step", "optimizer")
        phases.label_backward(update.model, ("lm_head", "model.norm"))
        update(batch)  # warm-up: the optimizer state exists from here on
        start = _rss_mib()
        phases.peaks = {}
        with phases.sampling():
            update(batch)
        peaks = dict(phases.peaks)
        live = LiveTensors(int(min_mib * 2**20), lambda: phases.now)
        with live:
            update(batch)
        if trainer == "ours":
            update_module.clip_gradients = clip
    return {
        "model": model_name, "trainer": trainer, "checkpointing": checkpointing, "start": start,
        "phases": {name: peak - start for name, peak in peaks.items()},
        "live": {"maximum": live.maximum / 2**20,
                 "tensors": [(size / 2**20, op, phase) for size, op, phase in live.at_maximum]},
    }


def _entered(phases: Phases, name: str, function: Callable[..., Any], args: Any,
             kwargs: Any) -> Any:
    with phases.entered(name):
        return function(*args, **kwargs)


def report(result: dict[str, Any]) -> str:
    lines = [f"{result['trainer']} on {result['model']}, gradient checkpointing "
             f"{'on' if result['checkpointing'] else 'off'}; resident at the start "
             f"{result['start']} MiB", "", "| phase | peak above the start, MiB |", "|---|---:|"]
    lines += [f"| {name} | {peak} |" for name, peak in result["phases"].items()]
    lines += ["", f"Tensors made during the update alive at their largest total "
                  f"({result['live']['maximum']:.0f} MiB):", "",
              "| MiB | operator | phase |", "|---:|---|---|"]
    lines += [f"| {size:.1f} | `{op}` | {phase} |" for size, op, phase in result["live"]["tensors"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="a model of update_memory.py's MODELS")
    parser.add_argument("--trainer", choices=("ours", "trl"), default="ours")
    parser.add_argument("--checkpointing", choices=("on", "off"), default="off")
    parser.add_argument("--min-mib", type=float, default=1.0,
                        help="smallest tensor the live count keeps (MiB)")
    args = parser.parse_args(argv)
    print(report(trace(args.model, args.trainer, args.checkpointing == "on", args.min_mib)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
