"""Running model-written programs under kernel-enforced limits, with verdicts decided outside
the program's process.

A self-contained package (it imports nothing else of mtgrpo), so it can be used, audited and
fuzzed alone::

    from mtgrpo.sandbox import run_python, run_python_io, SandboxLimits

    run_python("def add(a, b):\\n    return a + b", ["assert add(1, 2) == 3"]).passed  # (True,)

The threat model, what each test form costs and guarantees, and the limits are in
``docs/sandbox.md``.
"""

from mtgrpo.sandbox.plan import TestPlan, prepare_tests
from mtgrpo.sandbox.run import (
    SANDBOX_STATUSES,
    IOCase,
    SandboxLimits,
    SandboxResult,
    SandboxUnavailableError,
    ensure_sandbox,
    run_python,
    run_python_io,
)

__all__ = [
    "SANDBOX_STATUSES",
    "IOCase",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailableError",
    "TestPlan",
    "ensure_sandbox",
    "prepare_tests",
    "run_python",
    "run_python_io",
]
