"""Float tolerances derived from float32 precision and the size of the values compared.

Two float32 computations of the same quantity by different kernels (a chunked against a full
log-softmax, a packed against a padded forward, KV-cached decoding against one forward, two
summation orders of a gradient) round differently: each rounding is off by at most half a unit
in the last place (ulp), and the ulp grows with the magnitude (one ulp of 5.7 is 4.8e-7, so an
absolute 1e-6 allows barely two roundings of an entropy near 6). Which kernel, vector width and
summation order runs depends on the CPU (AVX2, AVX-512, AMX, NEON) and on the thread count, so a
tolerance that passes on one machine can fail on the next unless it is stated in ulps:

    atol = ulps * eps32 * max(1, max |expected|)        eps32 = 2**-23 = 1.19e-7

``max(1, ...)`` keeps an absolute floor of ``ulps * eps32`` for values that are near zero,
where the error is that of the O(1) terms they were computed from (a log-prob near 0 is a
difference of two logsumexps of size 1 or more). ``ulps`` is chosen per comparison, with a
comment: roughly, how many roundings can differ between the two computations. The suite uses

    2-8   one elementwise formula, or hand values against a float32 evaluation
    16    a short reduction or a softmax by another implementation, a loss summed elsewhere
    32    log-probs and entropies of one model forward through other kernels (a chunked head,
          another attention kernel, a merged adapter), a 300-term log-softmax in two shapes
    64    KV-cached decoding against one forward; gradients summed in another order

On the AMD EPYC (AVX-512, no AMX) where an absolute 1e-6 failed, every comparison's observed
error was at most a ninth of its allowance, and under a twentieth for most, with 1 and 2
threads (measured with the log below: issue 11). Each
allowance must stay far below what a real bug changes (a wrong temperature, position or
mask moves a log-prob by more than 1e-2; the comment next to each comparison names the bug
it guards against).

Comparisons that are exact by construction (the same kernel on the same inputs, padding that
must be ``== 0``, greedy tokens) stay exact (``atol=0`` or ``==``), never this helper.

Set ``MTGRPO_TOLERANCE_LOG=/some/file`` to append, for every comparison, the test, the ulps
allowed and the ulps observed: how much head-room each tolerance has on this CPU.
"""

from __future__ import annotations

import os
import sys

import torch

EPS32 = torch.finfo(torch.float32).eps


def f32_atol(expected: torch.Tensor | float, ulps: float) -> float:
    """``ulps * eps32 * max(1, max |expected|)``: the absolute tolerance for ``expected``."""
    magnitude = torch.as_tensor(expected).detach().double().abs()
    finite = magnitude[torch.isfinite(magnitude)]
    largest = float(finite.max()) if finite.numel() else 0.0
    return ulps * EPS32 * max(1.0, largest)


def assert_close_f32(
    actual: torch.Tensor | float,
    expected: torch.Tensor | float,
    *,
    ulps: float,
    scale: float | None = None,
    msg: str | None = None,
) -> None:
    """``torch.testing.assert_close`` with ``rtol=0`` and ``atol=f32_atol(expected, ulps)``.

    ``scale`` replaces ``max |expected|`` where the roundings happened on larger values than
    the ones compared (a log-prob near -2 computed from logits near 60 is rounded at 60).
    Tensors keep their dtypes, which must match as ``assert_close`` requires; a Python float
    or list of floats as ``expected`` takes the dtype of ``actual``, and two of them are
    compared as float64.
    """
    if not isinstance(actual, torch.Tensor):
        actual = torch.as_tensor(actual, dtype=torch.float64)
    if not isinstance(expected, torch.Tensor):
        expected = torch.as_tensor(expected, dtype=actual.dtype)
    atol = f32_atol(expected if scale is None else scale, ulps)
    _log(actual, expected, ulps, atol)
    size = "max |expected|" if scale is None else f"scale {scale:.3g}"
    rule = f"tolerance {ulps:g} float32 ulps of max(1, {size}) = {atol:.3g}"
    torch.testing.assert_close(
        actual, expected, rtol=0, atol=atol,
        msg=lambda default: f"{msg + ': ' if msg else ''}{default}\n{rule}",
    )  # fmt: skip


def _log(actual: torch.Tensor, expected: torch.Tensor, ulps: float, atol: float) -> None:
    path = os.environ.get("MTGRPO_TOLERANCE_LOG")
    if not path or actual.shape != expected.shape:
        return
    difference = (actual.detach().double() - expected.detach().double()).abs()
    difference = difference[torch.isfinite(difference)]
    worst = float(difference.max()) if difference.numel() else 0.0
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
    caller = sys._getframe(2)  # the test's line (or its helper's) that asked for the comparison
    where = f"{os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}"
    with open(path, "a", encoding="utf-8") as log:
        log.write(f"{test}\t{where}\t{ulps:g}\t{worst / (atol / ulps):.2f}\n")
