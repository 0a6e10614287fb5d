"""Answer extraction: the text of a completion and the final answer written in it.

Every function here is total and linear-time: it accepts any object, never raises, and its
work is bounded by the size caps below whatever the input (no regular expression with
nested quantifiers runs over model output, so a 10 MB adversarial string cannot trigger
catastrophic backtracking).

Caps (documented limits, not tuning knobs):

* :data:`MAX_TEXT_CHARS` (1,000,000 characters, about 250k tokens): a completion longer than
  this has no answer (extraction returns ``None``, verifiers score it as wrong). No sampling
  budget in use produces such a completion; one that does is degenerate output.
* :data:`MAX_BOXED_CHARS` (10,000 characters): the content of a ``\\boxed{...}`` is scanned
  for its matching brace up to this length, and only the last
  :data:`MAX_BOXED_CANDIDATES` (16) ``\\boxed`` occurrences are tried.
* :data:`MAX_NUMBER_CHARS` (1,000 characters): a longer "number" is not an answer.

Styles (registered in :data:`ANSWER_STYLES`):

* ``"tag"``: the content of the last ``<answer>...</answer>`` pair (whitespace stripped).
* ``"boxed"``: the content of the last complete ``\\boxed{...}`` with balanced braces.
* ``"last_number"``: the last number: optional minus sign, ASCII digits with optional
  thousands separators (removed) and an optional decimal part. Only ASCII digits count:
  Arabic-Indic or fullwidth digits are not numbers here, since a reader (and the checkers
  downstream) would not treat them as the same token.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from mtgrpo.algo.registry import Registry

__all__ = [
    "ANSWER_STYLES",
    "MAX_BOXED_CANDIDATES",
    "MAX_BOXED_CHARS",
    "MAX_NUMBER_CHARS",
    "MAX_TEXT_CHARS",
    "completion_text",
    "extract_answer",
    "extract_boxed",
    "extract_last_number",
    "extract_tag",
]

MAX_TEXT_CHARS = 1_000_000  # about 250k tokens: longer is degenerate output
MAX_BOXED_CHARS = 10_000
MAX_BOXED_CANDIDATES = 16  # with MAX_BOXED_CHARS: at most 16 bounded scans per text
MAX_NUMBER_CHARS = 1_000

AnswerExtractor = Callable[[str], "str | None"]
ANSWER_STYLES: Registry[AnswerExtractor] = Registry("answer style")

# The last number, found as the *first* match in the reversed text, so the search stops at
# the last digit of the original and never backtracks over earlier numbers. Reversed
# grammar of ``-?(d{1,3}(,ddd)+ | d+)(.d+)?``; a minus counts as a sign only when the
# character before it (after it, reversed) is not part of a word, a number or a bracket.
_REVERSED_NUMBER = re.compile(
    r"(?:[0-9]+\.)?(?:(?:[0-9]{3},)+[0-9]{1,3}(?![0-9])|[0-9]+)(?:-(?![0-9A-Za-z_)\].]))?"
)
_BOXED = "\\boxed"
_BRACES = re.compile(r"[{}]")
_SPACES = re.compile(r"\s*")


def completion_text(completion: Any) -> str:
    """The text of one completion: a string, or TRL's conversational form.

    A conversational completion is a list of messages ``[{"role": "assistant", "content":
    ...}]``; the contents of its assistant messages are joined (content given as a list of
    parts contributes its ``"text"`` parts). Anything else gives ``""``.

    >>> completion_text([{"role": "assistant", "content": "<answer>4</answer>"}])
    '<answer>4</answer>'
    >>> completion_text(None)
    ''
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if not isinstance(completion, (list, tuple)):
        return ""
    texts = [
        _content_text(message.get("content"))
        for message in completion
        # the model's own turns only: a tool's or user's text in a multi-turn completion must
        # not earn the policy a reward
        if isinstance(message, dict) and message.get("role", "assistant") == "assistant"
    ]
    return "".join(texts)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        # multimodal parts: only text carries an answer
        parts = [part.get("text") for part in content if isinstance(part, dict)]
        return "".join(part for part in parts if isinstance(part, str))
    return ""


@ANSWER_STYLES.register("tag")
def extract_tag(text: str, tag: str = "answer") -> str | None:
    """Content of the last complete ``<tag>...</tag>`` pair, stripped, or ``None``.

    >>> extract_tag("<answer>1</answer> then <answer> 2 </answer>")
    '2'
    """
    if not isinstance(text, str) or len(text) > MAX_TEXT_CHARS:
        return None
    opening, closing = f"<{tag}>", f"</{tag}>"
    end = text.rfind(closing)  # the last pair: a final answer wins over drafts before it
    if end < 0:
        return None
    start = text.rfind(opening, 0, end)
    if start < 0:
        return None
    return text[start + len(opening) : end].strip()


@ANSWER_STYLES.register("boxed")
def extract_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (balanced braces), stripped, or ``None``.

    Whitespace between ``\\boxed`` and its brace is allowed.

    Tries the last :data:`MAX_BOXED_CANDIDATES` occurrences from the end; the first whose
    braces balance (within :data:`MAX_BOXED_CHARS`, and before the next ``\\boxed`` that was
    already tried) wins, so a trailing unbalanced ``\\boxed{`` does not hide an earlier
    complete one. A group that does not close before a later, unbalanced ``\\boxed`` cannot
    close at all, which keeps the total scan linear.

    >>> extract_boxed(r"so \\boxed{\\frac{1}{2}} and \\boxed{3")
    '\\\\frac{1}{2}'
    """
    if not isinstance(text, str) or len(text) > MAX_TEXT_CHARS:
        return None
    end = len(text)
    # at most 16 tries, however many \boxed the text holds
    for _ in range(MAX_BOXED_CANDIDATES):
        position = text.rfind(_BOXED, 0, end)
        if position < 0:
            return None
        content = _balanced_content(text, position + len(_BOXED), end)
        if content is not None:
            return content.strip()
        end = position
    return None


def _balanced_content(text: str, start: int, end: int) -> str | None:
    """Text inside the brace group opening at ``start`` (after whitespace), closed before
    ``end``."""
    start = _SPACES.match(text, start, end).end()  # type: ignore[union-attr]  # always matches
    if start >= end or text[start] != "{":
        return None
    depth = 0
    # + 2: the two braces around MAX_BOXED_CHARS of content
    for brace in _BRACES.finditer(text, start, min(end, start + MAX_BOXED_CHARS + 2)):
        depth += 1 if brace.group() == "{" else -1
        if depth == 0:
            return text[start + 1 : brace.start()]
    return None


@ANSWER_STYLES.register("last_number")
def extract_last_number(text: str) -> str | None:
    """The last number in the text (thousands separators removed), or ``None``.

    >>> extract_last_number("3 apples cost 1,250.5 cents, i.e. -7 left")
    '-7'
    >>> extract_last_number("x = 12.")
    '12'
    """
    if not isinstance(text, str) or len(text) > MAX_TEXT_CHARS:
        return None
    # The number ends at the last digit; from there the reversed grammar is matched in
    # place (a regular-expression search without a literal prefix would try every position).
    last = max(text.rfind(digit) for digit in "0123456789")
    if last < 0:
        return None
    match = _REVERSED_NUMBER.match(text[last::-1])
    if match is None or len(match.group()) > MAX_NUMBER_CHARS:
        return None
    # '1,250' and '1250' are one answer
    return match.group()[::-1].replace(",", "")


def extract_answer(text: Any, style: str | Sequence[str] = "tag") -> str | None:
    """The final answer written in ``text`` by ``style``, or ``None`` when there is none.

    ``style`` is a name in :data:`ANSWER_STYLES` (``"tag"``, ``"boxed"``, ``"last_number"``)
    or a sequence of names tried in order (the first that finds an answer wins). ``text`` may
    be a completion in TRL's conversational form. Never raises on the text; an unknown style
    is a ``ValueError`` listing the valid ones.

    >>> extract_answer("<think>...</think><answer> 8 * 2 - 1 </answer>")
    '8 * 2 - 1'
    >>> extract_answer(r"The result is \\boxed{42}.", style=("tag", "boxed"))
    '42'
    """
    styles = (style,) if isinstance(style, str) else tuple(style)
    # looked up before the text: an unknown style fails even on an empty completion
    extractors = [ANSWER_STYLES.get(name) for name in styles]
    content = completion_text(text)
    for extractor in extractors:
        answer = extractor(content)
        if answer is not None:
            return answer
    return None
