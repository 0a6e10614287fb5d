"""Build and check ``.whl/``: the wheels a GPU machine without network needs to run
``scripts/gpu-check.sh`` at the locked versions.

    python scripts/gpu_wheelhouse.py          # download the wheels into .whl/, then check them
    python scripts/gpu_wheelhouse.py --check  # check an existing .whl/ only

The target is the GPU machine this project is lent (Python 3.12, Linux x86-64, no package
index), whose image already holds torch with CUDA, triton, numpy, scipy, pandas, pyarrow,
matplotlib, rich, pytest and many more (:data:`PREINSTALLED`). The wheelhouse carries:

* the Hugging Face stack at the locked versions (:data:`CARRIED`), since what the check
  measures must be the product ``requirements/lock.txt`` installs, whatever the image holds;
* every other locked package that the image lacks (reasoning-gym and its generators,
  math-verify, gguf, ...).

torch, triton and the CUDA libraries are never carried: the machine's own build is the one
that matches its driver. The check reads each wheel's ``Requires-Dist`` for Python 3.12 on
Linux x86-64 and fails when a requirement is met neither by a wheel in the house (at a
version the requirement admits) nor by the image. The device tool carries at most 64 MiB:
the house must stay well under it (the check fails above :data:`MAX_BYTES`).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements" / "lock.txt"
HOUSE = ROOT / ".whl"
MAX_BYTES = 48 * 2**20
PYTHON = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_34_x86_64",
             "manylinux_2_35_x86_64", "manylinux_2_31_x86_64", "manylinux_2_24_x86_64")

# The GPU machine's image (the device tool's KINDS.md, "Python packages already there").
_IMAGE = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib
jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator
lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx
ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf
psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools
shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz
torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers
treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug
wheel wrapt xarray xxhash yarl zipp
"""
PREINSTALLED = frozenset(canonicalize_name(name) for name in _IMAGE.split())
# Carried at the locked version even though the image has some version of them.
CARRIED = frozenset({"transformers", "tokenizers", "huggingface-hub", "peft", "accelerate",
                     "safetensors", "trl", "datasets"})
# Never carried: the machine's own CUDA build and what comes with it; the linter (not run there).
NEVER = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*|ruff)$")
_LINE = re.compile(r"^([A-Za-z0-9_.\-]+)==([^ ;]+)\s*(?:;\s*(.*))?$")


def _environment() -> dict[str, str]:
    env = default_environment()
    env.update(python_version=PYTHON, python_full_version=f"{PYTHON}.0", sys_platform="linux",
               platform_system="Linux", platform_machine="x86_64", os_name="posix",
               implementation_name="cpython", platform_python_implementation="CPython")
    return env


def locked_for_gpu(lock_text: str) -> dict[str, str]:
    """``{name: version}`` of the locked packages to carry for Python 3.12 on Linux x86-64."""
    from packaging.markers import Marker

    env, chosen = _environment(), {}
    for line in lock_text.splitlines():
        match = _LINE.match(line.strip())
        if not match:
            continue
        name, version, marker = canonicalize_name(match[1]), match[2], match[3]
        if marker and not Marker(marker).evaluate(env):
            continue
        if NEVER.match(name) or (name in PREINSTALLED and name not in CARRIED):
            continue
        chosen[name] = version
    return chosen


@dataclass(frozen=True)
class Wheel:
    name: str
    version: Version
    requires: tuple[Requirement, ...]


def read_wheel(path: Path) -> Wheel:
    """A wheel's name, version and ``Requires-Dist`` (from its METADATA)."""
    name, version, _, _ = parse_wheel_filename(path.name)
    with zipfile.ZipFile(path) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(metadata).decode("utf-8", "replace")
    requires = tuple(Requirement(line.split(":", 1)[1].strip())
                     for line in text.splitlines() if line.startswith("Requires-Dist:"))
    return Wheel(canonicalize_name(name), version, requires)


def unresolved(wheels: list[Wheel]) -> list[str]:
    """Every requirement of a wheel (for Python 3.12, Linux x86-64, no extras) met neither by
    a wheel of the house at an admitted version nor by the machine's image; and duplicates."""
    env = {**_environment(), "extra": ""}
    house: dict[str, Version] = {}
    problems = []
    for wheel in wheels:
        if wheel.name in house:
            problems.append(f"two wheels of {wheel.name}: pip would refuse the install")
        house[wheel.name] = wheel.version
    for wheel in wheels:
        for requirement in wheel.requires:
            if requirement.marker is not None and not requirement.marker.evaluate(env):
                continue
            name = canonicalize_name(requirement.name)
            if name in house:
                if not requirement.specifier.contains(house[name], prereleases=True):
                    problems.append(f"{wheel.name} needs {requirement}, the house has "
                                    f"{name} {house[name]}")
            elif name not in PREINSTALLED:
                problems.append(f"{wheel.name} needs {requirement}: no wheel, not in the image")
    return problems


def download(packages: dict[str, str], house: Path) -> None:
    """Fetch each package's wheel for Python 3.12 on Linux x86-64 from the index; a package
    published only as a source archive is built into a wheel by a local Python 3.12
    (``$MTGRPO_PYTHON312``, default ``python3.12``)."""
    house.mkdir(exist_ok=True)
    for stale in house.glob("*.whl"):
        name, version, _, _ = parse_wheel_filename(stale.name)
        if packages.get(canonicalize_name(name)) != str(version):
            stale.unlink()
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    for name, version in sorted(packages.items()):
        spec = f"{name}=={version}"
        fetched = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "--python-version", PYTHON, "--implementation", "cp",
             *platforms, "--platform", "any", "-d", str(house), spec],
            capture_output=True, text=True,
        )  # fmt: skip
        if fetched.returncode != 0:
            python = os.environ.get("MTGRPO_PYTHON312", f"python{PYTHON}")
            print(f"  {spec}: no wheel on the index, building one with {python}")
            subprocess.run([python, "-m", "pip", "wheel", "--quiet", "--no-deps",
                            "-w", str(house), spec], check=True)


def check(house: Path, packages: dict[str, str]) -> list[str]:
    """Problems of the house against the packages it should hold."""
    wheels = [read_wheel(path) for path in sorted(house.glob("*.whl"))]
    have = {w.name: str(w.version) for w in wheels}
    problems = [f"missing {name}=={version}" for name, version in sorted(packages.items())
                if have.get(name) != version]
    problems += unresolved(wheels)
    size = sum(path.stat().st_size for path in house.glob("*.whl"))
    if size > MAX_BYTES:
        problems.append(f"the house holds {size / 2**20:.1f} MiB, above {MAX_BYTES / 2**20:.0f} "
                        "MiB (the device tool carries at most 64 MiB with the working tree)")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="check .whl/ without downloading")
    parser.add_argument("--house", type=Path, default=HOUSE)
    options = parser.parse_args(argv)
    packages = locked_for_gpu(LOCK.read_text(encoding="utf-8"))
    if not options.check:
        download(packages, options.house)
    problems = check(options.house, packages)
    size = sum(path.stat().st_size for path in options.house.glob("*.whl")) / 2**20
    print(f"{options.house}: {len(packages)} wheels for Python {PYTHON}, {size:.1f} MiB")
    for problem in problems:
        print(f"  problem: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
