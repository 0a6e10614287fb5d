"""``./run.sh``: the README's main command picks the quickstart or the recipe named by --config.

run.sh is copied into a temporary tree whose set-up script and ``mtgrpo`` entry point only
record how they were called, so the dispatch is tested without installing anything.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "run.sh", tmp_path / "run.sh")
    (tmp_path / "scripts").mkdir()
    setup = tmp_path / "scripts" / "setup-env.sh"
    setup.write_text("#!/usr/bin/env bash\necho setup >> \"$(dirname \"$0\")/../calls\"\n")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    entry = tmp_path / ".venv" / "bin" / "mtgrpo"
    entry.write_text('#!/usr/bin/env bash\necho "mtgrpo $*" >> "$(dirname "$0")/../../calls"\n')
    for script in (setup, entry, tmp_path / "run.sh"):
        script.chmod(0o755)
    return tmp_path


def _run(tree: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    done = subprocess.run(["bash", str(tree / "run.sh"), *args], capture_output=True, text=True,
                          timeout=30)
    calls = tree / "calls"
    return done, calls.read_text().splitlines() if calls.exists() else []


def test_without_config_it_sets_up_and_runs_the_quickstart_with_the_overrides(tree):
    done, calls = _run(tree, "--max_steps", "50")
    assert done.returncode == 0, done.stderr
    assert calls == ["setup", "mtgrpo train quickstart --max_steps 50"]


@pytest.mark.parametrize("form", [["--config", "smollm2-cpu"], ["--config=smollm2-cpu"]])
def test_config_names_the_recipe_and_the_rest_are_overrides(tree, form):
    done, calls = _run(tree, *form, "--max_steps", "5")
    assert done.returncode == 0, done.stderr
    assert calls == ["setup", "mtgrpo train smollm2-cpu --max_steps 5"]


@pytest.mark.parametrize("args", [["--config"], ["--config", ""], ["--config", "--max_steps"]])
def test_config_without_a_name_fails_before_the_set_up(tree, args):
    done, calls = _run(tree, *args)
    assert done.returncode == 2
    assert "--config needs a recipe name or a run file" in done.stderr
    assert calls == []
