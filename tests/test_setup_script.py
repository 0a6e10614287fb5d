"""``scripts/setup-env.sh`` says what it installs and that it happens once, and lets pip's
progress show (lines without bars in a log); a second run with nothing changed is silent.

The script runs in a temporary tree against a fake interpreter that records its calls, so
nothing is installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FAKE_PYTHON = """#!/usr/bin/env bash
echo "python $* [PIP_PROGRESS_BAR=${PIP_PROGRESS_BAR:-}]" >> "$CALLS"
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; fi
if [ "$1" = "-" ]; then cat > /dev/null; fi
exit 0
"""


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup-env.sh", tmp_path / "scripts" / "setup-env.sh")
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "lock.txt").write_text("torch==2.13.0\nnumpy==2.0.0\n")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    for name, text in (("python3", FAKE_PYTHON), ("nvidia-smi", "#!/bin/sh\nexit 1\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return tmp_path


def _setup(tree: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CALLS": str(tree / "calls"), "MTGRPO_VENV": str(tree / ".venv"),
           "MTGRPO_PYTHON": str(tree / "fake-bin" / "python3"),
           "PATH": f"{tree / 'fake-bin'}:{os.environ['PATH']}"}
    env.pop("MTGRPO_TORCH_INDEX", None)
    # stdout is a pipe, as in CI; stdin is not a terminal either: nothing may wait for input
    return subprocess.run(["bash", str(tree / "scripts" / "setup-env.sh")], env=env,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_each_install_phase_is_announced_as_first_run_only_and_pip_shows_its_lines(tmp_path):
    tree = _tree(tmp_path)
    done = _setup(tree)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("[setup]")]
    installs = [line for line in said if "installing" in line]
    assert len(installs) == 2  # torch, then mtgrpo and the rest
    assert all("first run only" in line for line in installs)
    assert all(line.endswith(" min)") for line in installs)
    assert "torch==2.13.0 into" in installs[0]
    assert said[-1].startswith(f"[setup] {tree / '.venv'} ready in ")
    pip_calls = [line for line in (tree / "calls").read_text().splitlines()
                 if " -m pip " in line]
    assert len(pip_calls) == 2
    for call in pip_calls:
        assert " -q" not in call.split("install")[0]  # pip's own lines are shown
        assert "[PIP_PROGRESS_BAR=off]" in call  # off a terminal: lines, not redrawn bars
        assert "--no-input" in call
    again = _setup(tree)
    assert again.returncode == 0
    assert again.stderr == ""


@pytest.mark.parametrize("script", ["setup-env.sh", "setup-vllm-env.sh"])
def test_the_real_pip_accepts_what_the_scripts_pass_it(script):
    # The fake interpreter above records calls; this runs the real pip with the options the
    # script puts before each command (an option of one pip command placed there is refused)
    # and the environment it sets, for the commands the script runs.
    text = (ROOT / "scripts" / script).read_text()
    options = re.search(r'pip=\("\$venv/bin/python" -m pip ([^)]*)\)', text).group(1).split()
    assert "export PIP_PROGRESS_BAR=off" in text
    env = {**os.environ, "PIP_PROGRESS_BAR": "off"}
    for command in (["install", "--help"], ["uninstall", "--help"]):
        done = subprocess.run([sys.executable, "-m", "pip", *options, *command], env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
