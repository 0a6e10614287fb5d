"""Figures about the code's layout, measured the same way on any checkout.

    python scripts/code_figures.py                  # this checkout
    python scripts/code_figures.py --density PATH   # comment density of another tree or file

Prints a Markdown table: the native configuration's sections and options, the lines of
``trainer/trainer.py`` and of ``training_step``, the reward's path to the loss (hand-offs and
files, from docs/architecture.md's table), the README's lines, and the share of non-blank lines
holding a ``#`` comment (and with docstring lines counted too), over ``src/mtgrpo`` and per
package. ``--density`` measures other trees by the same rule (TRL's
``trl/trainer/grpo_trainer.py``, nanochat's ``nanochat/``), so a comparison uses one definition.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def comment_density(path: Path, docstrings: bool = False) -> tuple[int, int]:
    """(non-blank lines, lines holding a ``#`` comment) over ``path`` (a ``.py`` file or every
    ``.py`` file under a folder). A comment is a tokenizer ``COMMENT`` token, so a ``#`` inside
    a string is not one; a line with code and a trailing comment counts once. ``docstrings``:
    the lines of module, class and function docstrings count too."""
    files = [path] if path.is_file() else sorted(path.rglob("*.py"))
    lines = commented = 0
    for file in files:
        text = file.read_text(encoding="utf-8")
        lines += sum(1 for line in text.splitlines() if line.strip())
        tokens = tokenize.generate_tokens(io.StringIO(text).readline)
        numbers = {t.start[0] for t in tokens if t.type == tokenize.COMMENT}
        if docstrings:
            numbers |= _docstring_lines(text)
        commented += len(numbers)
    return lines, commented


def _docstring_lines(text: str) -> set[int]:
    """The line numbers of the docstrings of ``text``'s module, classes and functions."""
    found: set[int] = set()
    kinds = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, kinds) and ast.get_docstring(node, clean=False) is not None:
            first = node.body[0]
            found.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return found


def function_lines(path: Path, name: str) -> tuple[int, int]:
    """(lines from ``def`` to the end, of which code) of the first function called ``name``
    in ``path``; code excludes the docstring, comment-only and blank lines."""
    text = path.read_text(encoding="utf-8")
    source = text.splitlines()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            body = node.body
            docstring = (body[0].lineno, body[0].end_lineno) if ast.get_docstring(node) else (0, -1)
            span = range(node.lineno, node.end_lineno + 1)
            code = [n for n in span if not docstring[0] <= n <= docstring[1]
                    and source[n - 1].strip() and not source[n - 1].strip().startswith("#")]
            return len(span), len(code)
    raise LookupError(f"no function {name!r} in {path}")


def reward_path(architecture: Path) -> tuple[int, list[str]]:
    """(hand-offs, files in order of first appearance) of the table under "A reward's path to
    the loss" in docs/architecture.md: one row per hand-off, its file in the second column."""
    text = architecture.read_text(encoding="utf-8")
    section = text.split("## A reward's path to the loss", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if re.match(r"\| \d+ \|", line)]
    files: list[str] = []
    for row in rows:
        where = row.split("|")[2].strip().strip("`")
        if where not in files:
            files.append(where)
    return len(rows), files


def native_options() -> tuple[int, int]:
    """(sections, options) of the native configuration, ``mtgrpo.config.TrainConfig``."""
    sys.path.insert(0, str(ROOT / "src"))
    from mtgrpo.config import FIELD_SECTION, SECTIONS

    return len(SECTIONS), len(FIELD_SECTION)


def _both(path: Path) -> str:
    return (f"{_percent(comment_density(path))}; with docstrings "
            f"{_percent(comment_density(path, docstrings=True)).split(' (')[0]}")


def _percent(counts: tuple[int, int]) -> str:
    lines, commented = counts
    return f"{100 * commented / lines:.1f} % ({commented:,} of {lines:,})" if lines else "-"


def figures() -> list[tuple[str, str]]:
    src = ROOT / "src" / "mtgrpo"
    trainer = src / "trainer" / "trainer.py"
    sections, options = native_options()
    step_total, step_code = function_lines(trainer, "training_step")
    handoffs, files = reward_path(ROOT / "docs" / "architecture.md")
    rows = [
        ("native config (`TrainConfig`)", f"{options} options in {sections} sections"),
        ("`trainer/trainer.py`", f"{len(trainer.read_text().splitlines())} lines"),
        ("`training_step`", f"{step_total} lines, {step_code} of code"),
        ("reward → loss", f"{handoffs} hand-offs in {len(files)} files"),
        ("README.md", f"{len((ROOT / 'README.md').read_text().splitlines())} lines"),
        ("comment lines, `src/mtgrpo`", _both(src)),
    ]
    packages = sorted(p for p in src.iterdir() if p.is_dir() and any(p.rglob("*.py")))
    rows += [(f"comment lines, `{p.name}/`", _percent(comment_density(p))) for p in packages]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--density", nargs="+", type=Path, metavar="PATH",
                        help="only the comment density of these files or folders")
    options = parser.parse_args(argv)
    rows = ([(str(p), _both(p)) for p in options.density]
            if options.density else figures())
    print("| figure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
