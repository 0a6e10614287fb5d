"""Which hardware computes in bfloat16 natively, and what ``bf16: auto`` resolves to.

bfloat16 pays where the hardware multiplies it natively: a CUDA GPU that supports it, or a
CPU with the bf16 dot-product instructions (x86: ``avx512_bf16`` on AMD Zen 4 and newer and
Intel Cooper Lake / Sapphire Rapids and newer, ``amx_bf16`` on Intel Sapphire Rapids and newer;
Arm: the ``bf16`` feature, e.g. Graviton 3, Apple M2). Elsewhere torch emulates it, slower
than float32. Measured on a 2-core AMD EPYC with ``avx512_bf16``: a ``[64, 256] x [256, 1376]``
matrix product 1.7 ms in float32, 0.8 ms in bfloat16 (one thread).

Importing this module imports neither torch nor transformers.
"""

from __future__ import annotations

import functools
import platform
import subprocess
from pathlib import Path

__all__ = ["CPU_BF16_MIN_WIDTH", "cpu_bf16_feature", "model_width", "resolve_bf16"]

CPU_BF16_MIN_WIDTH = 256
"""``bf16: auto`` on a CPU stays off for models narrower than this (``hidden_size``): their
matrix products are too small for bfloat16's faster arithmetic to pay for autocast's casts.
Measured on the 2-core AMD EPYC (``avx512_bf16``), one thread: the quickstart's tiny model
(hidden 128) took 47.5 s for 150 warm-start steps with bf16 against 35.3 s without, and its
GRPO step 0.73-0.76 s against 0.80 s; at hidden 256 (the ``cpu-tiny`` benchmark) the GRPO step
is 1.3x faster with bf16, at 576 (SmolLM2-135M) 1.55x."""

# /proc/cpuinfo flags that mean native bf16 dot products, strongest first.
_X86_FLAGS = ("amx_bf16", "avx512_bf16", "avx_vnni_bf16")


def cpu_bf16_feature(cpuinfo: str | None = None, machine: str | None = None) -> str | None:
    """The CPU feature that gives native bfloat16 matrix products (``"amx_bf16"``,
    ``"avx512_bf16"``, ``"arm bf16"``), or None when the CPU has none (or it cannot be told).

    ``cpuinfo``: the text of ``/proc/cpuinfo`` (default: read it on Linux; on macOS the
    ``hw.optional.arm.FEAT_BF16`` sysctl is asked instead). ``machine``: ``platform.machine()``.
    """
    machine = (machine or platform.machine()).lower()  # macOS reports arm64, Linux aarch64
    if cpuinfo is None:
        cpuinfo = _read_cpuinfo()
        if cpuinfo is None:
            return _macos_bf16()
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        # x86 lists its flags under "flags", Arm under "Features"
        if key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    if machine in ("aarch64", "arm64"):
        return "arm bf16" if "bf16" in flags else None
    return next((flag for flag in _X86_FLAGS if flag in flags), None)


# one read per process: the CPU does not change
@functools.cache
def _read_cpuinfo() -> str | None:
    path = Path("/proc/cpuinfo")
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


@functools.cache
def _macos_bf16() -> str | None:
    if platform.system() != "Darwin":
        return None
    try:
        answer = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_BF16"],
                                capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return "arm bf16" if answer.stdout.strip() == "1" else None


def model_width(model: object) -> int | None:
    """The model's ``config.hidden_size`` (through a PEFT wrapper too), or None if it has none."""
    width = getattr(getattr(model, "config", None), "hidden_size", None)
    return width if isinstance(width, int) else None


def resolve_bf16(setting: bool | None, device_type: str,
                 hidden_size: int | None = None) -> tuple[bool, str]:
    """``(use bf16, why)`` for the config's ``bf16`` on a device of ``device_type``.

    ``True``/``False`` are kept; ``None`` (auto) turns bf16 on where the hardware computes it
    natively (:func:`cpu_bf16_feature` on a CPU; native bf16 on CUDA, emulation not counted;
    off elsewhere), except on a CPU for a model whose ``hidden_size`` is below
    :data:`CPU_BF16_MIN_WIDTH` (unknown width: on).
    """
    if setting is not None:
        return bool(setting), f"bf16={setting} in the config"
    if device_type == "cuda":
        import torch

        # native only: torch counts emulated bf16 (pre-Ampere GPUs) as supported by default,
        # and emulated bf16 is the slow path auto must not pick
        supported = torch.cuda.is_bf16_supported(including_emulation=False)
        return supported, f"auto: the GPU {'supports' if supported else 'lacks'} bfloat16"
    if device_type == "cpu":
        feature = cpu_bf16_feature()
        if feature is None:
            return False, "auto: this CPU has no native bfloat16 instructions"
        # measured: see CPU_BF16_MIN_WIDTH
        if hidden_size is not None and hidden_size < CPU_BF16_MIN_WIDTH:
            return False, (f"auto: this CPU has {feature}, but the model's hidden size "
                           f"{hidden_size} is below {CPU_BF16_MIN_WIDTH}, where autocast's "
                           "casts cost more than bfloat16 saves")
        return True, f"auto: this CPU has {feature}"
    return False, f"auto: bfloat16 is not turned on automatically on {device_type!r}"
