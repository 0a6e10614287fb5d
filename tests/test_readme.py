"""The README opens with the two commands and stays short; the generated configuration
reference (docs/configuration.md) matches the dataclasses; every relative link resolves."""

from __future__ import annotations

from pathlib import Path

from script_loader import load_script

ROOT = Path(__file__).resolve().parent.parent


def test_config_reference_is_in_sync():
    module = load_script("scripts/sync_readme.py")
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert module.synced(text) == text, "run: .venv/bin/python scripts/sync_readme.py"


def test_readme_opens_with_the_two_commands():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    block = lines[lines.index("```bash") + 1 : lines.index("```bash") + 3]
    assert block[0].startswith("./run.sh")
    assert block[1].startswith("./test.sh")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./test.sh" in ci


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, "the README is a front page: move reference material to docs/"


def test_relative_links_resolve():
    import re

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if target.startswith(("http://", "https://", "mailto:", "#")):
                continue
            path = target.split("#", 1)[0]
            if path and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken
