"""Rewrite the generated configuration reference, docs/configuration.md.

    .venv/bin/python scripts/sync_readme.py          # rewrite in place
    .venv/bin/python scripts/sync_readme.py --check  # exit 1 if the page is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path

from mtgrpo.compat import reference_markdown

README = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


def synced(text: str) -> str:
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{reference_markdown()}{END}{tail}"


def main() -> int:
    text = README.read_text(encoding="utf-8")
    new = synced(text)
    if "--check" in sys.argv:
        return int(new != text)
    README.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
