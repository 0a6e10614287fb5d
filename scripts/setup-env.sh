#!/usr/bin/env bash
# Creates (once) the project's virtual environment in .venv and installs mtgrpo into it, with
# the tested versions of every dependency (requirements/lock.txt, written by scripts/lock.sh).
#
# On a machine without an NVIDIA GPU, the CPU build of torch is installed *before*
# anything that depends on torch, so pip never pulls the multi-GB CUDA build.
#   MTGRPO_TORCH_INDEX    package index for the CPU build, e.g. https://download.pytorch.org/whl/cpu
#                         (not needed where a local CPU wheel is on pip's find-links)
#   MTGRPO_PYTHON         interpreter for the venv (default: python3; 3.11 or newer)
#   MTGRPO_VENV           where the venv lives (default: .venv in the repository)
# The set-up re-runs when pyproject.toml, the lock or this script change. It says what it
# installs and shows pip's progress: its download bars in a terminal, its "Collecting ..." and
# "Downloading ..." lines (no bars) in a log or CI job. Nothing is asked interactively.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${MTGRPO_VENV:-$root/.venv}"
py="${MTGRPO_PYTHON:-python3}"
lock="$root/requirements/lock.txt"
stamp="$venv/.mtgrpo-installed"
want="$(cat "$root/pyproject.toml" "$lock" "$root/scripts/setup-env.sh" | sha1sum | cut -d" " -f1)"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
begin=$SECONDS
if [ ! -x "$venv/bin/python" ]; then
    echo "[setup] creating $venv (first run only; later runs reuse it)" >&2
    "$py" -m venv "$venv"
fi
"$venv/bin/python" - <<'PY' || exit 1
import sys
if sys.version_info < (3, 11):
    sys.exit(f"[setup] mtgrpo needs Python 3.11 or newer (transformers 5 and TRL do); this venv "
             f"has {sys.version.split()[0]}: set MTGRPO_PYTHON to a newer interpreter and "
             "remove the venv")
PY
pip=("$venv/bin/python" -m pip --disable-pip-version-check --no-input)
if [ ! -t 1 ]; then
    # a log gets pip's lines, not bars redrawn into it (an environment variable: the
    # --progress-bar option belongs to pip's install command, not to pip itself)
    export PIP_PROGRESS_BAR=off
fi
torch_version="$(sed -n 's/^torch==\([^ ;]*\).*/\1/p' "$lock" | head -1)"
installed="$("$venv/bin/python" -c "import torch; print(torch.__version__.split('+')[0])" 2>/dev/null || true)"
if [ "$installed" != "$torch_version" ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        echo "[setup] NVIDIA GPU found: installing torch==$torch_version with CUDA into $venv" \
             "(first run only; ~2.5 GB, ~3-10 min)" >&2
        "${pip[@]}" install "torch==$torch_version"
    else
        echo "[setup] no GPU: installing the CPU build torch==$torch_version into $venv first" \
             "(first run only; ~200 MB, ~1-3 min)" >&2
        if [ -n "${MTGRPO_TORCH_INDEX:-}" ]; then
            "${pip[@]}" install "torch==$torch_version" --index-url "$MTGRPO_TORCH_INDEX"
        else
            "${pip[@]}" install "torch==$torch_version"
        fi
    fi
fi
echo "[setup] installing mtgrpo (editable) and the locked versions of its dependencies into" \
     "$venv, with its test tools, gguf, TRL and DeepSpeed (first run only; ~2-5 min)" >&2
# DeepSpeed without its CUDA ops: on a machine without a GPU nothing to compile them for, and on
# one they would take many minutes; the CPU communication helper it needs compiles at its first
# start instead (g++ and the Python headers, about a minute, cached in ~/.cache/torch_extensions)
export DS_BUILD_OPS="${DS_BUILD_OPS:-0}"
"${pip[@]}" install --constraint "$lock" -e "$root[dev,gguf,bench,deepspeed]"
"$venv/bin/python" -c "import mtgrpo, torch"
echo "$want" > "$stamp"
echo "[setup] $venv ready in $((SECONDS - begin)) s; later runs skip the set-up until" \
     "pyproject.toml, requirements/lock.txt or this script change" >&2
