"""Built-in verifiers: rule-based reward functions that are safe on hostile model output.

Every reward function here follows TRL's contract
``f(prompts, completions, completion_ids=None, **columns) -> list[float | None]``, accepts
string or conversational completions, never raises on model output, documents its range,
and does bounded work per completion (see each module's caps). Configuration errors (a
missing column, a malformed test) raise ``TypeError``/``ValueError`` before any work.

=========================  =========================================  ===============
reward                     checks                                     range
=========================  =========================================  ===============
:func:`format_reward`      ``<think>..</think>\\n<answer>..</answer>``  {0, 1}
:func:`countdown_reward`   exact arithmetic on the given numbers      {0, 1} / None
:func:`math_reward`        math-verify against ``answer``             {0, 1} / None
:func:`code_reward`        tests in the sandbox (or syntax only)      [0, 1]
``length_reward(...)``     distance to a target length                [0, 1]
``reasoning_gym_reward``   an audited reasoning-gym scorer            [0, 1] / None
=========================  =========================================  ===============

:data:`VERIFIERS` names the ready-made functions (``length_reward`` and
``reasoning_gym_reward`` are factories: call them with their settings).
"""

from __future__ import annotations

from collections.abc import Callable

from mtgrpo.algo.registry import Registry
from mtgrpo.rewards.verifiers.answer import (
    ANSWER_STYLES,
    MAX_TEXT_CHARS,
    completion_text,
    extract_answer,
    extract_boxed,
    extract_last_number,
    extract_tag,
)
from mtgrpo.rewards.verifiers.code import code_reward, extract_code, syntax_reward
from mtgrpo.rewards.verifiers.countdown import CountdownCheck, countdown_check, countdown_reward
from mtgrpo.rewards.verifiers.format import ThinkAnswer, format_reward, parse_think_answer
from mtgrpo.rewards.verifiers.length import length_reward
from mtgrpo.rewards.verifiers.math import math_reward
from mtgrpo.rewards.verifiers.reasoning_gym import AUDITED_FAMILIES, reasoning_gym_reward
from mtgrpo.sandbox import (
    IOCase,
    SandboxLimits,
    SandboxResult,
    run_python,
    run_python_io,
)

__all__ = [
    "ANSWER_STYLES",
    "AUDITED_FAMILIES",
    "MAX_TEXT_CHARS",
    "VERIFIERS",
    "CountdownCheck",
    "IOCase",
    "SandboxLimits",
    "SandboxResult",
    "ThinkAnswer",
    "code_reward",
    "completion_text",
    "countdown_check",
    "countdown_reward",
    "extract_answer",
    "extract_boxed",
    "extract_code",
    "extract_last_number",
    "extract_tag",
    "format_reward",
    "length_reward",
    "math_reward",
    "parse_think_answer",
    "reasoning_gym_reward",
    "run_python",
    "run_python_io",
    "syntax_reward",
]

# ready-made functions only: the factories need their settings first
VERIFIERS: Registry[Callable[..., list[float | None]]] = Registry("built-in verifier")
VERIFIERS.add("format", format_reward, aliases=("format_reward",))
VERIFIERS.add("countdown", countdown_reward, aliases=("countdown_reward",))
# 'accuracy': TRL 1.16's math-verify reward is called accuracy_reward
VERIFIERS.add("math", math_reward, aliases=("math_reward", "accuracy"))
VERIFIERS.add("code", code_reward, aliases=("code_reward",))
