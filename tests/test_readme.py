"""The README's generated configuration reference matches the dataclasses."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_config_reference_is_in_sync():
    spec = importlib.util.spec_from_file_location("sync_readme", ROOT / "scripts/sync_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert module.synced(text) == text, "run: .venv/bin/python scripts/sync_readme.py"


def test_readme_opens_with_the_two_commands():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    block = lines[lines.index("```bash") + 1 : lines.index("```bash") + 3]
    assert block[0].startswith("./run.sh")
    assert block[1].startswith("./test.sh")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./test.sh" in ci
