"""The lock of tested versions (``requirements/lock.txt``): it pins every dependency
``pyproject.toml`` declares at a version its range admits, and the environment the tests run in
is the locked one (the product a user installs is the product these tests measured)."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^([A-Za-z0-9_.\-]+)==([^ ;]+)\s*(?:;\s*(.*))?$")


def _locked() -> dict[str, str]:
    """``{name: version}`` of the lock's lines that apply to this interpreter and platform."""
    pins = {}
    for line in (ROOT / "requirements" / "lock.txt").read_text(encoding="utf-8").splitlines():
        match = LINE.match(line.strip())
        if match and (not match[3] or Marker(match[3]).evaluate()):
            pins[canonicalize_name(match[1])] = match[2]
    return pins


def _declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    return [Requirement(r) for r in (*project["dependencies"], *extras["dev"], *extras["gguf"],
                                     *extras["bench"], *extras["deepspeed"])]


def test_the_lock_pins_every_declared_dependency_inside_its_range() -> None:
    locked = _locked()
    for requirement in _declared():
        name = canonicalize_name(requirement.name)
        assert name in locked, f"{name} is declared in pyproject.toml but not locked"
        assert requirement.specifier.contains(Version(locked[name]), prereleases=True), (
            f"the lock pins {name}=={locked[name]} outside pyproject.toml's {requirement}")


def test_this_environment_is_the_locked_one() -> None:
    if metadata.version("transformers") != _locked()["transformers"]:
        pytest.fail("this environment is not the locked one; run ./test.sh (it installs "
                    "requirements/lock.txt) or scripts/test-matrix.sh for other versions")
    different = {}
    for name, version in _locked().items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # locked for another platform's needs (CUDA libraries beside a CPU torch)
        if Version(installed).public != Version(version).public:  # 2.13.0+cpu is 2.13.0
            different[name] = (installed, version)
    assert different == {}, f"installed vs locked: {different}"
