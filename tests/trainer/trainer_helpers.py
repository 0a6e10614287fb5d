"""Small datasets, reward functions and configs shared by the trainer tests (and the scripts
they run in subprocesses)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from mtgrpo import GRPOConfig


def rows(per_task: int = 8) -> list[dict[str, Any]]:
    """Two tasks: 'alpha' with plain-text prompts, 'beta' with chat prompts."""
    out: list[dict[str, Any]] = []
    for i in range(per_task):
        out.append({"prompt": f"Write letters {i}:", "task": "alpha", "target": "a"})
        out.append({"prompt": [{"role": "user", "content": f"Count to {i}"}], "task": "beta",
                    "target": "b"})
    return out


def _text(completion: Any) -> str:
    return completion if isinstance(completion, str) else completion[-1]["content"]


def alpha_reward(prompts, completions, task, **kwargs):
    """1 when the completion has more vowels than 'x', on alpha rows only (None elsewhere)."""
    return [float(sum(ch in "aeiou" for ch in _text(c)) > 2) if t == "alpha" else None
            for c, t in zip(completions, task, strict=True)]


def beta_reward(prompts, completions, task, **kwargs):
    """Even completion length scores 1, on beta rows only (None elsewhere)."""
    return [float(len(_text(c)) % 2 == 0) if t == "beta" else None
            for c, t in zip(completions, task, strict=True)]


def alpha_reward_routed(prompts, completions, **kwargs):
    return [float(sum(ch in "aeiou" for ch in _text(c)) > 2) for c in completions]


def beta_reward_routed(prompts, completions, **kwargs):
    return [float(len(_text(c)) % 2 == 0) for c in completions]


def length_bonus(prompts, completions, **kwargs):
    """A second channel on every row: shorter is better (0..1)."""
    return [1.0 - min(len(_text(c)), 40) / 40 for c in completions]


def args(output_dir, config_class: type = GRPOConfig, **overrides: Any) -> GRPOConfig:
    options: dict[str, Any] = {
        "output_dir": str(output_dir), "max_steps": 2, "num_generations": 4,
        "prompts_per_step": 4, "max_completion_length": 12, "max_prompt_length": 128,
        "learning_rate": 5e-3,
        "save_steps": 0, "logging_steps": 1, "seed": 0, "lr_scheduler_type": "constant",
        # float32 throughout: the tests compare computations across code paths and processes,
        # which bfloat16 (bf16: auto, on CPUs with native bf16) would round apart; the bf16
        # path has tests of its own
        "bf16": False,
        # the end-of-run report (figures and summary, 1-5 s a run) is tested on its own in
        # test_trainer_first_hour; the other tests train for what the steps do
        "report_at_end": False,
    }
    options.update(overrides)
    build = getattr(config_class, "from_flat", None)  # the native tree takes flat names so
    return build(options) if build is not None else config_class(**options)


def validation_rows(per_task: int = 3) -> list[dict[str, Any]]:
    """Held-out rows of both tasks (prompts the training rows do not have)."""
    out: list[dict[str, Any]] = []
    for i in range(per_task):
        out.append({"prompt": f"Spell the word {i}:", "task": "alpha", "target": "a"})
        out.append({"prompt": [{"role": "user", "content": f"Name {i} colours"}],
                    "task": "beta", "target": "b"})
    return out


def run_and_leave(main: Callable[[], None]) -> None:
    """Run a launched script's ``main``, then leave without the interpreter's teardown once it
    returned (its outputs written, its process group destroyed). A sharded model's parameters
    keep their process groups alive past ``destroy_process_group``; at teardown a gloo worker
    thread can still be freeing a finished collective's tensors, which needs the GIL the
    finalising interpreter holds, and the process aborts (``terminate called without an active
    exception``, exit -6, seen in about 1 of 8 DeepSpeed ZeRO-3 runs on a loaded 2-core CPU;
    the core shows ``~AsyncAllgatherWork`` in ``ProcessGroupGloo::runLoop``). An exception in
    ``main`` still ends the process with an error."""
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def step_records(run: Any) -> list[dict[str, Any]]:
    """A run directory's step records (train and eval, not the run records each train() call
    writes) without their timings, which differ between runs."""
    from mtgrpo.reporting import read_metrics

    return [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))}
            for r in read_metrics(run) if r["split"] != "run"]


def assert_resumed_exactly(full: Any, crashed: Any, steps: int = 6) -> None:
    """The resumed run ``crashed`` logged the steps the uninterrupted ``full`` did and ended
    with the same trainable weights, bit for bit (its last checkpoint's)."""
    import torch
    from safetensors.torch import load_file

    expected, actual = step_records(full), step_records(crashed)
    assert [r["step"] for r in actual] == list(range(1, steps + 1))
    assert actual == expected
    last = f"checkpoint-{steps}/trainable.safetensors"
    final_full, final_resumed = load_file(str(full / last)), load_file(str(crashed / last))
    assert final_full.keys() == final_resumed.keys()
    for name, tensor in final_full.items():
        assert torch.equal(tensor, final_resumed[name]), name
