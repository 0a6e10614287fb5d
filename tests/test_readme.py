"""The README's generated configuration reference matches the dataclasses."""

from __future__ import annotations

from pathlib import Path

from script_loader import load_script

ROOT = Path(__file__).resolve().parent.parent


def test_config_reference_is_in_sync():
    module = load_script("scripts/sync_readme.py")
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert module.synced(text) == text, "run: .venv/bin/python scripts/sync_readme.py"


def test_readme_opens_with_the_two_commands():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    block = lines[lines.index("```bash") + 1 : lines.index("```bash") + 3]
    assert block[0].startswith("./run.sh")
    assert block[1].startswith("./test.sh")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./test.sh" in ci
