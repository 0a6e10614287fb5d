"""GSM8K grade-school math as a task: the loader, the answer-format reward, and data preparation.

GSM8K (Cobbe et al., 2021, "Training Verifiers to Solve Math Word Problems"; hub dataset
``openai/gsm8k``, configs ``main`` and ``socratic``, splits ``train`` and ``test``) holds rows
``{"question": ..., "answer": ...}`` whose ``answer`` is the worked solution, with calculator
annotations such as ``<<48/2=24>>``, ending in a line ``#### <final number>``.

:func:`load_gsm8k` turns those rows into the row schema of :mod:`mtgrpo.tasks` (one dict per
problem)::

    {"id": "gsm8k/train/0", "task": "gsm8k", "prompt": <text or chat messages>,
     "answer": "72", "solution": "<reasoning without calculator annotations>",
     "answer_format": "boxed", "split": "train"}

``answer`` is the final number as a string: thousands separators, a leading ``+`` and a ``$``
are removed (``#### 1,250`` -> ``"1250"``, ``#### -4`` -> ``"-4"``); anything else after
``####`` is a layout error naming the row. ``answer_format`` records where the prompt asked the
model to put its answer (``\\boxed{}`` or ``<answer>`` tags): :func:`answer_format_reward` reads it.

Reward channels of the GSM8K example (``configs/gsm8k-math.yaml``; docs/examples.md):

* correctness: :func:`mtgrpo.rewards.math_reward` against ``answer`` (math-verify, {0, 1});
* format: :func:`answer_format_reward` ({0, 0.5, 1});
* length: :func:`mtgrpo.rewards.length_reward` with a target length ([0, 1]).

Without hub access (CI, air-gapped clusters) pass a local file in GSM8K's layout (JSONL, JSON,
parquet or CSV) or a directory holding ``<split>.jsonl`` / ``<split>-*.parquet`` (what
``huggingface-cli download openai/gsm8k --repo-type dataset`` writes under ``main/``).
``python -m mtgrpo.tasks.gsm8k OUT_DIR`` writes ``train.jsonl`` and ``test.jsonl`` in our schema,
the files the example config trains and evaluates on.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mtgrpo.rewards.guard import score_each
from mtgrpo.rewards.verifiers.answer import MAX_NUMBER_CHARS, completion_text, extract_answer
from mtgrpo.tasks.data import FILE_SUFFIXES, _read_file, write_jsonl_splits
from mtgrpo.tasks.prompts import ANSWER_FORMATS, PROMPT_FORMATS, format_prompt

__all__ = [
    "GSM8K_HUB_NAME",
    "answer_format_reward",
    "gsm8k_prompt",
    "load_gsm8k",
    "main",
    "parse_gsm8k_answer",
    "write_gsm8k",
]

GSM8K_HUB_NAME = "openai/gsm8k"

_FINAL_MARK = "####"
# The final number after "####": optional sign and dollar sign, digits with optional
# thousands separators (every group of three), optional decimals. Anchored, no nested
# quantifiers: linear on any input.
_FINAL_NUMBER = re.compile(
    r"(?P<sign>[-+]?)\s*\$?\s*(?P<int>[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?P<frac>\.[0-9]+)?"
)
_CALCULATOR = re.compile(r"<<[^<>]*>>")  # GSM8K's calculator annotations, e.g. <<48/2=24>>
# A bare number as a model writes it inside the answer container: "72", "-4", "1,250", "$3.50".
_BARE_NUMBER = re.compile(r"-?\s*\$?\s*(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?")

_INSTRUCTION = "Solve the problem step by step. Write the final answer, a single number, {where}."

# The reward of answer_format_reward (format channel); see its docstring.
FORMAT_NUMBER, FORMAT_OTHER, FORMAT_MISSING = 1.0, 0.5, 0.0


def parse_gsm8k_answer(answer: Any) -> tuple[str, str]:
    """``(solution, final_number)`` from a GSM8K ``answer`` field.

    The final number is what follows the last ``####``, normalised (separators, ``+`` and
    ``$`` removed); the solution is the text before it with calculator annotations
    ``<<...>>`` removed and surrounding whitespace stripped.

    >>> parse_gsm8k_answer("She has 3 + 4 = <<3+4=7>>7 apples.\\n#### 7")
    ('She has 3 + 4 = 7 apples.', '7')
    >>> parse_gsm8k_answer("#### -1,250.5")[1]
    '-1250.5'

    Raises ``ValueError`` (the rule, the text and the fix) when ``answer`` is not a string,
    has no ``####`` line, or what follows ``####`` is not one number.
    """
    if not isinstance(answer, str):
        raise ValueError(
            f"a GSM8K answer must be text ending in '#### <number>', got {type(answer).__name__}"
        )
    reasoning, mark, final = answer.rpartition(_FINAL_MARK)
    if not mark:
        raise ValueError(
            f"GSM8K answer {_shorten(answer)!r} has no '#### <number>' line; GSM8K's layout ends "
            "every answer with '#### ' and the final number"
        )
    match = _FINAL_NUMBER.fullmatch(final.strip())
    if match is None:
        raise ValueError(
            f"GSM8K answer ends with '#### {_shorten(final.strip())}', which is not one number; "
            "write the final answer as a number such as '#### 72', '#### -4' or '#### 1,250'"
        )
    sign = "-" if match["sign"] == "-" else ""  # a leading "+" is dropped (module docstring)
    number = sign + match["int"].replace(",", "") + (match["frac"] or "")
    solution = _CALCULATOR.sub("", reasoning).strip()
    return solution, number


def _shorten(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def gsm8k_prompt(
    question: str,
    prompt_format: str = "chat",
    answer_format: str = "boxed",
    *,
    system_prompt: str | None = None,
) -> str | list[dict[str, str]]:
    """The prompt for one question: the question, then an instruction naming the container of
    the final answer, wrapped by a prompt format of :data:`mtgrpo.tasks.PROMPT_FORMATS`
    (``chat``: one user message, after an optional system message; ``plain``: the R1-style text
    template of the MT-GRPO paper)."""
    where = ANSWER_FORMATS.get(answer_format).where
    text = f"{question.strip()}\n\n{_INSTRUCTION.format(where=where)}"
    return format_prompt(text, prompt_format, system_prompt=system_prompt)


def load_gsm8k(
    source: str | Path = GSM8K_HUB_NAME,
    split: str = "train",
    *,
    config: str = "main",
    prompt_format: str = "chat",
    answer_format: str = "boxed",
    task: str = "gsm8k",
    limit: int | None = None,
    system_prompt: str | None = None,
    cache_dir: str | Path | None = None,
) -> list[dict[str, Any]]:
    """GSM8K problems as rows of our schema (module docstring), in the source's order.

    Args:
        source: the hub name (default ``openai/gsm8k``), a local file in GSM8K's layout
            (JSONL, JSON, parquet, CSV), or a directory holding ``<split>.jsonl`` or
            ``<split>-*.parquet`` files (directly or under ``<config>/``).
        split: the split to read (``train`` or ``test``); for a single local file it only
            labels the rows (the file *is* the split).
        config: the hub config, ``main`` or ``socratic``.
        prompt_format: ``chat`` (messages) or ``plain`` (text); see :func:`gsm8k_prompt`.
        answer_format: ``boxed`` (``\\boxed{}``) or ``answer_tag`` (``<answer>`` tags).
        task: the task label of every row.
        limit: keep only the first ``limit`` problems.
        system_prompt: a system message for the ``chat`` format.
        cache_dir: the ``datasets`` cache for the hub path.

    Raises:
        ValueError: a bad option (before any reading), a missing file, a row not in GSM8K's
            layout (naming the row and the fix), or a hub that cannot be reached (saying to
            pass a local file).
    """
    fmt = ANSWER_FORMATS.canonical(answer_format)
    PROMPT_FORMATS.canonical(prompt_format)
    if not isinstance(task, str) or not task.strip():
        raise ValueError(f"task={task!r} must be a non-empty task label such as 'gsm8k'")
    # True is an int: refused explicitly.
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit={limit!r} must be a positive integer or None (every problem)")
    raw, where = _read_source(source, split, config, cache_dir)
    raw = raw[:limit] if limit is not None else raw
    rows = []
    for index, record in enumerate(raw):
        question, solution, number = _checked_record(record, index, where)
        rows.append({
            "id": f"{task}/{split}/{index}",
            "task": task,
            "prompt": gsm8k_prompt(question, prompt_format, fmt, system_prompt=system_prompt),
            "answer": number,
            "solution": solution,
            "answer_format": fmt,
            "split": split,
        })
    if not rows:
        raise ValueError(f"{where} holds no GSM8K problems; pass a file with at least one row")
    return rows


def _checked_record(record: Any, index: int, where: str) -> tuple[str, str, str]:
    """``(question, solution, final_number)`` of one raw row, or a ``ValueError`` naming it."""
    layout = ("each row needs 'question' (the problem text) and 'answer' (the worked solution "
              "ending in '#### <number>')")
    if not isinstance(record, Mapping):
        raise ValueError(f"{where}: row {index} is a {type(record).__name__}, not a mapping; "
                         f"{layout}")
    question, answer = record.get("question"), record.get("answer")
    if not isinstance(question, str) or not question.strip() or answer is None:
        hint = ""
        if "prompt" in record and "task" in record:
            hint = "; these rows are already in mtgrpo's schema: load them with load_rows"
        raise ValueError(
            f"{where}: row {index} is not in GSM8K's layout (columns {sorted(record)}); "
            f"{layout}{hint}"
        )
    try:
        solution, number = parse_gsm8k_answer(answer)
    except ValueError as error:
        raise ValueError(f"{where}: row {index}: {error}") from error
    return question, solution, number


def _read_source(
    source: str | Path, split: str, config: str, cache_dir: str | Path | None
) -> tuple[list[Any], str]:
    """Raw rows and a description of where they came from (for error messages)."""
    if not isinstance(source, str | Path) or not str(source).strip():
        raise ValueError(f"source={source!r} must be a hub name, a file or a directory path")
    path = Path(source).expanduser()
    if path.is_file():
        return _read_file(path), str(path)
    if path.is_dir():
        files = _split_files(path, split, config)
        return [row for file in files for row in _read_file(file)], str(files[0].parent)
    text = str(source)
    local = isinstance(source, Path) or path.suffix.lower() in FILE_SUFFIXES
    if local or text.startswith((".", "/", "~")):  # a path was meant, not a hub name
        raise ValueError(
            f"no such file or directory: {text!r}; pass a GSM8K file (JSONL, JSON, parquet, "
            f"CSV), a directory of split files, or the hub name {GSM8K_HUB_NAME!r}"
        )
    return _from_hub(text, split, config, cache_dir), f"{text} ({config}, {split})"


def _split_files(root: Path, split: str, config: str) -> list[Path]:
    """The files of ``split`` in a directory: ``<split>.<suffix>`` or ``<split>-*.<suffix>``,
    in ``root/<config>`` first, then in ``root``."""
    # Huggingface-cli writes the hub's files under main/ (module docstring)
    for folder in (root / config, root):
        files = sorted(
            file for suffix in FILE_SUFFIXES
            for file in (*folder.glob(f"{split}{suffix}"), *folder.glob(f"{split}-*{suffix}"))
        )
        if files:
            return files
    raise ValueError(
        f"no {split!r} files in {str(root)!r} or {str(root / config)!r}; expected "
        f"'{split}.jsonl' or '{split}-*.parquet' (the layout of the hub's openai/gsm8k)"
    )


def _from_hub(name: str, split: str, config: str, cache_dir: str | Path | None) -> list[Any]:
    import datasets

    try:
        dataset = datasets.load_dataset(
            name, config, split=split, cache_dir=None if cache_dir is None else str(cache_dir)
        )
    except Exception as error:  # offline, not cached, unknown name or split: one clear answer
        raise ValueError(
            f"cannot load {name!r} (config {config!r}, split {split!r}) from the Hugging Face "
            f"hub: {type(error).__name__}: {error}. Without hub access, pass a local file in "
            "GSM8K's layout instead (load_gsm8k('path/to/train.jsonl'), rows with 'question' "
            "and 'answer' ending in '#### <number>') or a directory of split files"
        ) from error
    return dataset.to_list()


def answer_format_reward(
    prompts: Sequence[Any] | None,
    completions: Sequence[Any],
    completion_ids: Sequence[Sequence[int]] | None = None,
    *,
    answer_format: Sequence[str | None] | None = None,
    **columns: Any,
) -> list[float | None]:
    """The format channel: is the final answer a bare number in the container the prompt asked
    for?

    Per completion, with the container named by the row's ``answer_format`` column
    (``boxed`` or ``answer_tag``, as :func:`load_gsm8k` writes it) and its *last* occurrence:

    * 1.0 (:data:`FORMAT_NUMBER`): the container holds one number (``72``, ``-4``,
      ``1,250``, ``$3.50``);
    * 0.5 (:data:`FORMAT_OTHER`): the container is there but holds something else
      (``\\boxed{x = 72}``, ``\\boxed{\\frac{1}{2}}``, text longer than 1,000 characters);
    * 0.0 (:data:`FORMAT_MISSING`): no complete container;
    * ``None`` where the row's ``answer_format`` is ``None`` (the reward does not apply).

    Correctness is scored by another channel (``math_reward``), so a wrong number in the right
    place still earns the format reward. Linear-time on any text (the extractors of
    :mod:`mtgrpo.rewards.verifiers.answer`); never raises on model output.

    >>> answer_format_reward(None, [r"so \\boxed{1,250}", r"\\boxed{x=3}", "42"],
    ...                      answer_format=["boxed"] * 3)
    [1.0, 0.5, 0.0]
    """
    if answer_format is None:
        raise TypeError(
            "answer_format_reward needs the dataset column 'answer_format' (boxed or "
            "answer_tag per row), which load_gsm8k writes; add the column to your rows"
        )
    # a lone string has a len() too, of characters, not of completions
    if isinstance(completions, str) or len(answer_format) != len(completions):
        raise ValueError(
            f"answer_format_reward: {len(answer_format)} answer_format values for "
            f"{len(completions)} completions; a column holds one value per completion"
        )
    styles = {name: _style(name) for name in set(answer_format) if name is not None}

    def score(row: tuple[Any, str | None]) -> float | None:
        completion, fmt = row
        # A row that asks for no container: n/a (None), not a format failure.
        return None if fmt is None else _format_score(completion_text(completion), styles[fmt])

    # Model output is hostile input: an exception scores 0 for that row only.
    return score_each("answer_format_reward", zip(completions, answer_format, strict=True), score)


def _style(answer_format: str) -> str:
    """The extraction style of :func:`extract_answer` for an answer format's name."""
    return {"boxed": "boxed", "answer_tag": "tag"}[ANSWER_FORMATS.canonical(answer_format)]


def _format_score(text: str, style: str) -> float:
    content = extract_answer(text, style)
    if content is None:
        return FORMAT_MISSING
    # Bounded before the regex: longer text scores FORMAT_OTHER, never a number.
    if len(content) <= MAX_NUMBER_CHARS and _BARE_NUMBER.fullmatch(content.strip()):
        return FORMAT_NUMBER
    return FORMAT_OTHER


def write_gsm8k(
    out_dir: str | Path,
    source: str | Path = GSM8K_HUB_NAME,
    *,
    eval_limit: int | None = 200,
    **options: Any,
) -> dict[str, Path]:
    """Write ``train.jsonl`` (every training problem) and ``test.jsonl`` (the first
    ``eval_limit`` test problems; ``None``: all 1,319) in our schema under ``out_dir``.

    ``options`` go to :func:`load_gsm8k` (``config``, ``prompt_format``, ``answer_format``,
    ``system_prompt``, ``cache_dir``). Both splits are read before anything is written.
    """
    splits = {
        "train": load_gsm8k(source, "train", **options),
        "test": load_gsm8k(source, "test", limit=eval_limit, **options),
    }
    return write_jsonl_splits(out_dir, splits)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mtgrpo.tasks.gsm8k OUT_DIR [--source ...]``: the example's data files."""
    parser = argparse.ArgumentParser(
        prog="python -m mtgrpo.tasks.gsm8k",
        description="Write GSM8K train/test rows in mtgrpo's schema (train.jsonl, test.jsonl).",
    )
    parser.add_argument("out_dir", help="directory for train.jsonl and test.jsonl")
    parser.add_argument("--source", default=GSM8K_HUB_NAME,
                        help="hub name, or a local directory of GSM8K split files")
    parser.add_argument("--config", default="main", help="hub config: main or socratic")
    parser.add_argument("--prompt-format", default="chat", help="chat or plain")
    parser.add_argument("--answer-format", default="boxed", help="boxed or answer_tag")
    parser.add_argument("--eval-limit", type=int, default=200,
                        help="test problems to keep (0: all)")
    args = parser.parse_args(argv)
    try:
        written = write_gsm8k(
            # --eval-limit 0 keeps every test problem.
            args.out_dir, args.source, eval_limit=args.eval_limit or None, config=args.config,
            prompt_format=args.prompt_format, answer_format=args.answer_format,
        )
    except ValueError as error:
        parser.exit(2, f"error: {error}\n")
    for split, path in written.items():
        print(f"{split}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
