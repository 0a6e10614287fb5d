#!/usr/bin/env bash
# Creates (once) the project's virtual environment in .venv and installs mtgrpo into it.
#
# On a machine without an NVIDIA GPU, the CPU build of torch is installed *before*
# anything that depends on torch, so pip never pulls the multi-GB CUDA build.
#   MTGRPO_TORCH_VERSION  torch version to install (default 2.13.0)
#   MTGRPO_TORCH_INDEX    package index for the CPU build, e.g. https://download.pytorch.org/whl/cpu
#                         (not needed where a local CPU wheel is on pip's find-links)
#   MTGRPO_PYTHON         interpreter for the venv (default: python3)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
py="${MTGRPO_PYTHON:-python3}"
stamp="$venv/.mtgrpo-installed"
want="$(cat "$root/pyproject.toml" "$root/scripts/setup-env.sh" | sha1sum | cut -d" " -f1)"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
    echo "[setup] creating $venv" >&2
    "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        echo "[setup] NVIDIA GPU found: installing torch with CUDA" >&2
        "${pip[@]}" install "torch"
    else
        ver="${MTGRPO_TORCH_VERSION:-2.13.0}"
        echo "[setup] no GPU: installing the CPU build torch==$ver first" >&2
        if [ -n "${MTGRPO_TORCH_INDEX:-}" ]; then
            "${pip[@]}" install "torch==$ver" --index-url "$MTGRPO_TORCH_INDEX"
        else
            "${pip[@]}" install "torch==$ver"
        fi
    fi
fi
echo "[setup] installing mtgrpo (editable) with its test tools, gguf and TRL (for the parity tests)" >&2
"${pip[@]}" install -e "$root[dev,gguf,bench]"
"$venv/bin/python" -c "import mtgrpo, torch" 
echo "$want" > "$stamp"
