"""Supervised targets for task rows: the gold answer written the way the prompt asks for it.

A warm start has to teach a weak model three things GRPO cannot teach it from zero reward: the
answer container the task's reward reads (``<answer> … </answer>`` or ``\\boxed{…}``), the
``<think>…</think>`` layout, and when to stop. :func:`solutions_from_rows` turns task rows
(``prompt``, ``answer``, ``metadata``; the row schema of :mod:`mtgrpo.tasks.suite`) into
(prompt, completion) rows for :func:`mtgrpo.sft.sft_train`.

The completion is a template (:data:`SOLUTION_TEMPLATES`, or a format string) filled with

* ``{answer}``: the gold answer in the row's answer container, exactly as the prompt's own
  example shows it (``AnswerFormat.example``: ``<answer> GOLD </answer>`` / ``\\boxed{GOLD}``);
* ``{gold}``: the bare gold answer (countdown: one solution expression);
* ``{reasoning}``: a short text from :data:`REASONINGS`. It is deliberately *not* a worked
  solution, which we do not have: ``restate`` (default) restates the problem in one line
  (countdown: the numbers and the target; zebra: the question; ARC-1D: the task), ``none``
  leaves the think block empty. The model therefore learns the format, the answer container
  and the stop, plus the answers of the training problems; reasoning is left to GRPO.

The default template, ``think_answer``, is ``<think>\\n{reasoning}\\n</think>\\n{answer}``: with
the ``answer_tag`` format it satisfies the R1 format rule of
:mod:`mtgrpo.rewards.verifiers.format` (which is why nothing, not even a newline, precedes
``<think>``). A prompt that already ends with ``<think>`` (``think_prefix=True`` suites) gets
the completion without its leading ``<think>``, since the model continues inside the block.

Rows of test data (``split == "test"``, or the papers' released test sets recognised by
:func:`mtgrpo.tasks.is_paper_test_source`) are refused: training on them would contaminate
every later evaluation.
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from mtgrpo.algo.registry import Registry
from mtgrpo.tasks.paper import ensure_trainable
from mtgrpo.tasks.prompts import ANSWER_FORMATS, THINK_PREFIX

__all__ = ["REASONINGS", "SOLUTION_TEMPLATES", "solution_template", "solutions_from_rows"]

SOLUTION_TEMPLATES: Registry[str] = Registry("solution template")
# Nothing before <think>: the R1 format rule (module docstring)
SOLUTION_TEMPLATES.add("think_answer", "<think>\n{reasoning}\n</think>\n{answer}",
                       aliases=("r1", "think"))
SOLUTION_TEMPLATES.add("answer_only", "{answer}", aliases=("answer",))

_FIELDS = frozenset({"reasoning", "answer", "gold"})

# reasoning(metadata, family) -> one line of text (or "")
Reasoning = Callable[[Mapping[str, Any], str], str]


def _restate(metadata: Mapping[str, Any], family: str) -> str:
    """One line that restates the problem, without claiming any derivation."""
    if family == "countdown" and "numbers" in metadata and "target" in metadata:
        return (f"I need to reach {metadata['target']} from the numbers {list(metadata['numbers'])}"
                ", using each number exactly once with + - * /.")
    if family == "zebra_puzzles":
        return "I need the name of the person who lives in House 1, given the clues."
    if family == "arc_1d":
        return ("I need the rule that maps each example input grid to its output, applied to "
                "the test input.")
    return ""


REASONINGS: Registry[Reasoning] = Registry("solution reasoning")
REASONINGS.add("restate", _restate)
REASONINGS.add("none", lambda metadata, family: "", aliases=("empty",))


def solution_template(template: str) -> str:
    """A registered template name, or a format string using only the known fields."""
    text = SOLUTION_TEMPLATES.get(template) if template in SOLUTION_TEMPLATES else template
    if not isinstance(text, str):
        raise TypeError(f"template must be a template name or a format string, got {text!r}")
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}
    except ValueError as error:
        raise ValueError(f"template {text!r} is not a valid format string: {error}") from error
    unknown = sorted(fields - _FIELDS)
    if unknown:
        raise ValueError(
            f"template {template!r} uses unknown field(s) {unknown}; a template is one of "
            f"{SOLUTION_TEMPLATES.names()} or a format string with {{answer}} and optionally "
            "{reasoning} and {gold}"
        )
    if "answer" not in fields:
        raise ValueError(
            f"template {template!r} has no {{answer}} field, so the completion would not hold "
            "the answer the reward reads; add {answer}"
        )
    return text


def _metadata(row: Mapping[str, Any], number: int) -> dict[str, Any]:
    raw = row.get("metadata")
    if raw is None or raw == "":  # an empty metadata cell (CSV) is no metadata
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as error:
            raise ValueError(f"row {number}: metadata is not a JSON object ({error})") from error
    if not isinstance(raw, Mapping):
        raise ValueError(
            f"row {number}: metadata must be a JSON object string or a dict, got "
            f"{type(raw).__name__}"
        )
    return dict(raw)


def _prompt_opens_think(prompt: Any) -> bool:
    """The prompt ends inside a think block (a ``think_prefix`` prompt)."""
    if isinstance(prompt, str):
        return prompt.endswith(THINK_PREFIX)
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], Mapping):
        last = prompt[-1]
        return last.get("role") == "assistant" and str(last.get("content", "")).endswith(
            THINK_PREFIX
        )
    return False


def _gold(row: Mapping[str, Any], number: int) -> str:
    if "answer" not in row:
        raise ValueError(
            f"row {number} has no 'answer' column (columns: {sorted(row)}); solutions_from_rows "
            "needs task rows with gold answers (mtgrpo.tasks suites have them), or give "
            "prompt/completion rows to sft_train directly"
        )
    gold = row["answer"]
    if gold is None or not str(gold).strip():
        raise ValueError(
            f"row {number} (id {row.get('id')!r}) has an empty gold answer; drop the row or "
            "fill in its answer"
        )
    return str(gold).strip()


def solutions_from_rows(
    rows: Iterable[Mapping[str, Any]],
    template: str = "think_answer",
    *,
    reasoning: str = "restate",
    answer_format: str | None = None,
) -> list[dict[str, Any]]:
    """Each task row with a ``completion`` column: its gold answer in the expected format.

    ``rows``: task rows with ``prompt`` and ``answer`` (``metadata`` gives the family and the
    row's ``answer_format``; a row without one uses ``answer_format``, default
    ``answer_tag``). ``template``: a name in :data:`SOLUTION_TEMPLATES` or a format string with
    ``{answer}`` (and optionally ``{reasoning}``, ``{gold}``). ``reasoning``: a name in
    :data:`REASONINGS`. Returns new dicts (the input's columns plus ``completion``), in order.

    Raises ``ValueError`` for test rows, rows without ``prompt`` or a gold answer, and for a
    completion whose answer does not read back as the gold answer (a template that hides it).
    """
    text = solution_template(template)
    explain = REASONINGS.get(reasoning)
    default_format = ANSWER_FORMATS.canonical(answer_format or "answer_tag")
    rows = [dict(row) for row in rows]
    if not rows:
        raise ValueError("no rows were given; pass task rows with 'prompt' and 'answer'")
    ensure_trainable(rows)
    out = []
    for number, row in enumerate(rows):
        if "prompt" not in row:
            raise ValueError(f"row {number} has no 'prompt' column (columns: {sorted(row)})")
        gold = _gold(row, number)
        metadata = _metadata(row, number)
        fmt = ANSWER_FORMATS.get(metadata.get("answer_format", default_format))
        # Metadata's family first, else the task id's prefix ("countdown:easy")
        family = str(metadata.get("family") or str(row.get("task", "")).partition(":")[0])
        completion = text.format(
            reasoning=explain(metadata, family), answer=fmt.example(gold), gold=gold
        )
        # The prompt opened the think block: the model continues inside it.
        if _prompt_opens_think(row["prompt"]) and completion.startswith(THINK_PREFIX):
            completion = completion[len(THINK_PREFIX):]
        # The reward reads the last container: a template must not hide the gold.
        if fmt.extract(completion) != gold:
            raise ValueError(
                f"row {number}: the completion {completion!r} does not read back the gold answer "
                f"{gold!r} through the {fmt.name!r} format (the last {fmt.open.strip()}… wins); "
                "use a template with a single {answer}"
            )
        out.append({**row, "completion": completion})
    return out
