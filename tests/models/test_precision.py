"""``bf16: auto``: which CPUs and GPUs compute bfloat16 natively (mtgrpo.models.precision)."""

from __future__ import annotations

import pytest

from mtgrpo.models import precision
from mtgrpo.models.precision import cpu_bf16_feature, resolve_bf16

EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu vme sse sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni
"""
SAPPHIRE_RAPIDS = "flags\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
OLDER_X86 = "flags\t: fpu sse sse2 avx avx2 fma avx512f\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes sve bf16 i8mm\n"
GRAVITON2 = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes crc32 atomics\n"


@pytest.mark.parametrize(
    ("cpuinfo", "machine", "expected"),
    [
        (EPYC, "x86_64", "avx512_bf16"),
        (SAPPHIRE_RAPIDS, "x86_64", "amx_bf16"),  # the strongest feature is named
        (OLDER_X86, "x86_64", None),
        (GRAVITON3, "aarch64", "arm bf16"),
        (GRAVITON2, "aarch64", None),
        ("", "x86_64", None),
    ],
)
def test_the_cpu_feature_is_read_off_cpuinfo(cpuinfo: str, machine: str, expected: str | None):
    assert cpu_bf16_feature(cpuinfo, machine) == expected


def test_an_explicit_setting_is_kept() -> None:
    assert resolve_bf16(True, "cpu") == (True, "bf16=True in the config")
    assert resolve_bf16(False, "cuda") == (False, "bf16=False in the config")


def test_auto_follows_the_hardware(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "cpu_bf16_feature", lambda: "avx512_bf16")
    assert resolve_bf16(None, "cpu") == (True, "auto: this CPU has avx512_bf16")
    monkeypatch.setattr(precision, "cpu_bf16_feature", lambda: None)
    assert resolve_bf16(None, "cpu") == (False, "auto: this CPU has no native bfloat16 "
                                                "instructions")
    import torch

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert resolve_bf16(None, "cuda") == (True, "auto: the GPU supports bfloat16")
    # a GPU that only emulates bf16 (before Ampere): torch says yes when emulation counts
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: including_emulation)
    assert resolve_bf16(None, "cuda") == (False, "auto: the GPU lacks bfloat16")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert resolve_bf16(None, "cuda", hidden_size=64)[0] is True  # the width rule is the CPU's
    assert resolve_bf16(None, "mps")[0] is False


def test_auto_on_a_cpu_needs_a_model_wide_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "cpu_bf16_feature", lambda: "amx_bf16")
    assert precision.CPU_BF16_MIN_WIDTH == 256
    assert resolve_bf16(None, "cpu", hidden_size=256) == (True, "auto: this CPU has amx_bf16")
    on, why = resolve_bf16(None, "cpu", hidden_size=128)
    assert on is False
    assert why == ("auto: this CPU has amx_bf16, but the model's hidden size 128 is below 256, "
                   "where autocast's casts cost more than bfloat16 saves")
    assert resolve_bf16(None, "cpu", hidden_size=None)[0] is True  # width unknown: on
    assert resolve_bf16(True, "cpu", hidden_size=64) == (True, "bf16=True in the config")


def test_model_width_reads_the_config_through_wrappers() -> None:
    from types import SimpleNamespace

    assert precision.model_width(SimpleNamespace(config=SimpleNamespace(hidden_size=576))) == 576
    assert precision.model_width(SimpleNamespace(config=SimpleNamespace())) is None
    assert precision.model_width(object()) is None
