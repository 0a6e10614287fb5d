"""The GPU wheelhouse (``scripts/gpu_wheelhouse.py``): which locked packages it carries for the
GPU machine, and its check that every carried wheel's requirements are met there."""

from __future__ import annotations

import zipfile
from pathlib import Path

from packaging.version import Version

from script_loader import load_script

house = load_script("scripts/gpu_wheelhouse.py")

LOCK = """\
# a comment line
numpy==2.4.6 ; python_full_version < '3.12'
numpy==2.5.5 ; python_full_version >= '3.12'
colorama==0.4.6 ; sys_platform == 'win32'
torch==2.13.0
nvidia-cublas==13.1.1.3 ; sys_platform == 'linux'
transformers==5.24.0
reasoning-gym==0.1.25
ruff==0.17.6
rich==15.0.0
"""


def _wheel(directory: Path, name: str, version: str, *requires: str) -> Path:
    path = directory / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    metadata = "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA",
                         f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{metadata}")
    return path


def test_carries_what_the_image_lacks_and_the_locked_hugging_face_stack() -> None:
    chosen = house.locked_for_gpu(LOCK)
    # numpy and rich are in the image; torch and CUDA libraries never travel; ruff is not run
    # there; windows-only lines do not apply; transformers travels at the locked version
    # although the image has one
    assert chosen == {"transformers": "5.24.0", "reasoning-gym": "0.1.25"}


def test_requirements_met_by_the_house_or_the_image(tmp_path: Path) -> None:
    wheels = [
        house.read_wheel(_wheel(tmp_path, "trl", "1.16.0", "transformers>=4.56.2",
                                "numpy>=1.26", "liger-kernel>=0.8; extra == 'liger'",
                                "harbor>=0.13; python_version < '3.12'")),
        house.read_wheel(_wheel(tmp_path, "transformers", "5.24.0", "tokenizers<0.24,>=0.23.1")),
        house.read_wheel(_wheel(tmp_path, "tokenizers", "0.23.3")),
    ]
    assert wheels[0].version == Version("1.16.0")
    # numpy from the image; the extra and the Python-3.11-only requirement do not apply
    assert house.unresolved(wheels) == []


def test_unmet_requirements_and_duplicates_are_named(tmp_path: Path) -> None:
    old = house.read_wheel(_wheel(tmp_path, "tokenizers", "0.22.0"))
    wheels = [
        house.read_wheel(_wheel(tmp_path, "transformers", "5.24.0", "tokenizers<0.24,>=0.23.1",
                                "sentencepiece-nope>=1")),
        old,
        house.read_wheel(_wheel(tmp_path, "math-verify", "0.9.0")),
        house.read_wheel(_wheel(tmp_path, "math-verify", "0.8.0")),
    ]
    problems = house.unresolved(wheels)
    assert "two wheels of math-verify: pip would refuse the install" in problems
    assert ("transformers needs tokenizers<0.24,>=0.23.1, the house has tokenizers 0.22.0"
            in problems)
    assert any(p.startswith("transformers needs sentencepiece-nope>=1: no wheel") for p in problems)


def test_check_names_missing_wheels_and_size(tmp_path: Path, monkeypatch) -> None:
    _wheel(tmp_path, "reasoning-gym", "0.1.24")
    problems = house.check(tmp_path, {"reasoning-gym": "0.1.25"})
    assert problems == ["missing reasoning-gym==0.1.25"]
    monkeypatch.setattr(house, "MAX_BYTES", 10)
    assert any("above" in p and "64 MiB" in p for p in house.check(tmp_path, {}))
