"""Score completions with reasoning-gym's own scorers, for the families audited as safe.

``reasoning_gym_reward(name)`` builds a reward function that extracts the final answer
(``<answer>...</answer>`` by default, reasoning-gym's convention) and calls the dataset's
``score_answer(answer, entry)``. A scorer runs in this process on model output, so only
families whose scorer was read and found to do nothing but string and number handling are
allowed (:data:`AUDITED_FAMILIES`, audited against reasoning-gym 0.1.25). Findings:

* ``countdown``: **unsafe** upstream. ``CountdownDataset.score_answer`` passes the answer
  text to sympy's ``parse_expr``, which runs Python ``eval`` on it: an answer can execute
  code (one was seen creating a file). It is replaced by the safe
  :func:`~mtgrpo.rewards.verifiers.countdown.countdown_check`, mapped onto reasoning-gym's
  score levels: 1.0 correct; 0.05 parsed but wrong numbers or wrong value; 0.01 not
  parsed, empty, or division by zero. Stricter than upstream on purpose: no unary minus.
* ``zebra_puzzles``: lower-cases, removes newlines, compares to the oracle. Safe.
* ``arc_1d``, ``basic_arithmetic``, ``leg_counting``: no override of
  ``ProceduralDataset.score_answer``: 1.0 on exact match, ``len(oracle) / len(answer)``
  when the oracle is a substring, else 0. Safe (``basic_arithmetic`` uses ``eval`` only to
  generate its questions, never on answers).
* ``chain_sum``: ``utils.compute_decimal_reward``: ``Decimal`` parsing, then the substring
  rule. Safe.
* ``spell_backward``: lower-cased comparison and a per-character loop bounded by the
  oracle's length. Safe.
* ``word_sorting``: ``re.split(r",\\s*")`` (linear) and list comparisons. Safe.

Not allowed (examples): ``puzzle24`` (``parse_expr``, as countdown), the algebra families
(``sympify``/``parse_expr``), ``codeio``, ``propositional_logic``. Answers longer than
:data:`MAX_SCORED_ANSWER_CHARS` are scored as missing (``None``).

The entry a scorer needs comes from the dataset, per row:

* column ``entry``: the full reasoning-gym entry (``question``, ``answer``, ``metadata``),
  as a dict or a JSON string; or
* columns ``answer`` (the oracle) and ``metadata`` (a dict or JSON string; optional for
  families that only need the oracle). A ``metadata`` value that is itself a full entry
  (it has ``answer`` and ``metadata`` keys) is used as the entry.

Range: [0, 1] (whatever the family's scorer gives, clamped); ``None`` where a row has no
entry.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata as package_metadata
from typing import Any

from mtgrpo.algo.registry import Registry
from mtgrpo.rewards.guard import score_each
from mtgrpo.rewards.verifiers._batch import completion_texts, optional_column
from mtgrpo.rewards.verifiers.answer import ANSWER_STYLES, extract_answer
from mtgrpo.rewards.verifiers.countdown import countdown_check

__all__ = [
    "AUDITED_FAMILIES",
    "AUDITED_VERSION",
    "MAX_SCORED_ANSWER_CHARS",
    "AuditedFamily",
    "reasoning_gym_reward",
]

AUDITED_VERSION = "0.1.25"  # the release whose scorers were read; another one warns
MAX_SCORED_ANSWER_CHARS = 10_000  # upstream scorers run in this process: cap their input

Scorer = Callable[["str | None", dict[str, Any]], float]


@dataclass(frozen=True)
class AuditedFamily:
    """A reasoning-gym family whose scorer was read and allowed.

    Attributes:
        name: reasoning-gym's dataset name.
        scorer_qualname: the ``score_answer`` that was audited (checked when the reward is
            built, so a reasoning-gym release that moves scoring elsewhere is refused);
            ``None`` when this package scores the family itself.
        finding: what the audit found.
    """

    name: str
    scorer_qualname: str | None
    finding: str


AUDITED_FAMILIES: Registry[AuditedFamily] = Registry("audited reasoning-gym family")
for _family in (
    AuditedFamily("countdown", None, "upstream eval()s the answer (sympy parse_expr); ours"),
    AuditedFamily("zebra_puzzles", "ZebraDataset.score_answer", "case-insensitive match"),
    AuditedFamily("arc_1d", "ProceduralDataset.score_answer", "exact/substring match"),
    AuditedFamily("basic_arithmetic", "ProceduralDataset.score_answer", "exact/substring"),
    AuditedFamily("leg_counting", "ProceduralDataset.score_answer", "exact/substring match"),
    AuditedFamily("chain_sum", "ChainSumDataset.score_answer", "Decimal, then substring"),
    AuditedFamily("spell_backward", "SpellBackwardDataset.score_answer", "per-char match"),
    AuditedFamily("word_sorting", "WordSortingDataset.score_answer", "split and compare"),
):
    AUDITED_FAMILIES.add(_family.name, _family)


def reasoning_gym_reward(
    dataset_name: str, *, styles: str | Sequence[str] = "tag"
) -> Callable[..., list[float | None]]:
    """A reward scoring completions with the audited scorer of ``dataset_name``.

    ``styles``: where the answer is read (names of
    :data:`~mtgrpo.rewards.verifiers.answer.ANSWER_STYLES`, tried in order); reasoning-gym's
    prompts ask for ``<answer>...</answer>``. A family outside :data:`AUDITED_FAMILIES` is a
    ``ValueError`` listing the allowed ones. The function is named
    ``reasoning_gym_<dataset_name>``.

    >>> reward = reasoning_gym_reward("zebra_puzzles")
    >>> reward(None, ["<answer>Alice</answer>", "<answer>Bob</answer>"], answer=["alice"] * 2)
    [1.0, 0.0]
    """
    if dataset_name not in AUDITED_FAMILIES:
        raise ValueError(
            f"reasoning-gym family {dataset_name!r} is not on the allow-list of audited "
            f"scorers (a scorer runs on model output in this process); allowed: "
            f"{', '.join(AUDITED_FAMILIES.names())}. Score it with your own verifier, or read "
            "its score_answer and add it to AUDITED_FAMILIES"
        )
    family = AUDITED_FAMILIES.get(dataset_name)
    order = (styles,) if isinstance(styles, str) else tuple(styles)
    # an unknown style fails when the reward is built, not at the first batch
    for name in order:
        ANSWER_STYLES.canonical(name)
    scorer = _countdown_score if family.scorer_qualname is None else _upstream_scorer(family)

    def reward(
        prompts: Sequence[Any] | None,
        completions: Sequence[Any],
        completion_ids: Sequence[Sequence[int]] | None = None,
        **columns: Any,
    ) -> list[float | None]:
        texts = completion_texts(reward.__name__, completions)
        entries = _entries(reward.__name__, columns, len(texts))

        def score(row: tuple[str, dict[str, Any] | None]) -> float | None:
            text, entry = row
            if entry is None:
                return None
            answer = extract_answer(text, order)
            if answer is not None and len(answer) > MAX_SCORED_ANSWER_CHARS:
                answer = None  # scored as missing: the scorer never sees it
            return _checked_score(scorer, answer, entry)

        # a bad entry is the dataset's fault: it stops scoring instead of scoring 0
        return score_each(reward.__name__, zip(texts, entries, strict=True), score,
                          passthrough=(EntryError,))  # fmt: skip

    # one column and set of metrics per family: names come from __name__ (TRL's rule)
    reward.__name__ = reward.__qualname__ = f"reasoning_gym_{family.name}"
    return reward


def _upstream_scorer(family: AuditedFamily) -> Scorer:
    import reasoning_gym  # only upstream families need it: countdown is scored here

    installed = package_metadata.version("reasoning-gym")
    if installed != AUDITED_VERSION:
        warnings.warn(
            f"reasoning-gym {installed} is installed; its scorers were audited in "
            f"{AUDITED_VERSION}. Re-read {family.name}'s score_answer before trusting it.",
            stacklevel=3,
        )
    # the bound score_answer of the dataset built with its default config (factory.py)
    scorer = reasoning_gym.get_score_answer_fn(family.name)
    # a release that moved scoring elsewhere would run unaudited code on model output
    # an inherited method keeps its defining class's name (ProceduralDataset.score_answer)
    if getattr(scorer, "__qualname__", None) != family.scorer_qualname:
        raise ValueError(
            f"reasoning-gym's scorer for {family.name!r} is {scorer.__qualname__}, not the "
            f"audited {family.scorer_qualname}; audit it and update AUDITED_FAMILIES"
        )
    return scorer


def _countdown_score(answer: str | None, entry: dict[str, Any]) -> float:
    """reasoning-gym's countdown score levels, computed by the safe checker."""
    # CountdownDataset.score_answer's levels: 0.01 by default, 0.05 wrong, 1.0 correct
    if answer is None or not answer.strip():
        return 0.01
    metadata = entry["metadata"]
    check = countdown_check(answer, metadata["numbers"], metadata["target"])
    if check.correct:
        return 1.0
    # upstream gives 0.01 here too: its parse_expr or float() raises
    if not check.parsed or check.value is None:
        return 0.01
    return 0.05


class EntryError(ValueError):
    """A dataset entry that its family's scorer cannot score, whatever the answer."""


def _checked_score(scorer: Scorer, answer: str | None, entry: dict[str, Any]) -> float:
    """The scorer's value clamped to [0, 1] (0.0 when not finite).

    When the scorer raises, it is asked again with the entry's own oracle answer: if that
    fails too, the entry is at fault (dataset input: :class:`EntryError`, raised); if not,
    the model's answer made it fail, and the exception propagates to be counted by
    :func:`~mtgrpo.rewards.guard.score_each` (the sample scores 0).
    """
    try:
        value = float(scorer(answer, entry))
    except Exception as error:
        try:
            scorer(entry.get("answer"), entry)  # the oracle: a bad entry or a bad answer?
        except Exception:
            raise EntryError(
                f"the reasoning-gym entry does not fit its scorer ({error!r}); pass the full "
                f"entry (column 'entry') or 'answer' plus 'metadata'; entry: {entry!r:.200}"
            ) from error
        raise
    # NaN would read as not applicable, and inf would poison the group's statistics
    return min(max(value, 0.0), 1.0) if math.isfinite(value) else 0.0


def _entries(function: str, columns: Mapping[str, Any], rows: int) -> list[dict[str, Any] | None]:
    full = optional_column(function, columns, ("entry",), rows)
    if full is not None:
        return [None if cell is None else _mapping(function, "entry", cell) for cell in full]
    answers = optional_column(function, columns, ("answer",), rows)
    metadata = optional_column(function, columns, ("metadata",), rows)
    if answers is None and metadata is None:
        raise TypeError(
            f"{function} needs the reasoning-gym entry: a column 'entry' (the full entry) or "
            f"'answer' and 'metadata'; the columns passed were: {', '.join(sorted(columns))}"
        )
    entries: list[dict[str, Any] | None] = []
    for row in range(rows):
        meta = None if metadata is None else metadata[row]
        meta = {} if meta is None else _mapping(function, "metadata", meta)
        # a full entry stored in the metadata column (module docstring)
        if "answer" in meta and "metadata" in meta:
            entries.append(meta)
            continue
        answer = None if answers is None else answers[row]
        missing = answer is None and not meta  # no oracle, no metadata: not this family's row
        entries.append(None if missing else {"answer": answer, "metadata": meta})
    return entries


def _mapping(function: str, name: str, cell: Any) -> dict[str, Any]:
    if isinstance(cell, str):
        try:
            cell = json.loads(cell)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{function}: column {name!r} holds text that is not JSON: {error}"
            ) from None
    if not isinstance(cell, Mapping):
        raise ValueError(
            f"{function}: column {name!r} must hold a dict or a JSON object, got "
            f"{type(cell).__name__}"
        )
    return dict(cell)
