#!/usr/bin/env bash
# The GPU check in one command, on a CUDA machine without network (the device tool's H100:
# Python 3.12, torch, transformers, peft, accelerate and triton preinstalled):
#
#   here:        MTGRPO_PYTHON312=python3.12 python scripts/gpu_wheelhouse.py   # builds .whl/
#   on the GPU:  scripts/gpu-check.sh [tests|step|generation|profile|memory|all] # default all
#   on a CPU:    scripts/gpu-check.sh --dry-run    # the same steps, tiny settings, no install
#
# It installs .whl/ offline into /tmp/mtgrpo-site (put before the image's own packages, so the
# locked transformers / TRL / peft are the ones measured), then
#   tests       pytest tests/fast/test_static_gpu.py (CUDA-graph decoding)
#   step        benchmarks/step_time_vs_trl.py --workload gpu-qwen0.5b --trl-defaults
#               (TRL 1.16 at its best setting and at its defaults, side by side in one run)
#   generation  benchmarks/generation_speed.py --device cuda (hf, static, static-eager)
#   profile     benchmarks/profile_step.py --workload gpu-qwen0.5b (one profiled step of ours,
#               ours with the padded update and TRL: operators, launches, syncs per phase)
#   memory      benchmarks/update_memory.py --models qwen2.5-0.5b (peak memory of one update,
#               ours against TRL, gradient checkpointing off and on; max_memory_allocated)
#   vllm        (not in all) the tests marked vllm against vLLM's CUDA build, then
#               benchmarks/generation_speed.py --device cuda --backend vllm on the Qwen2.5-0.5B
#               shape (hf, static, static-eager and vllm side by side). It needs vLLM 0.32 for
#               the image's torch already installed (MTGRPO_VLLM_PYTHON, default $python): its
#               CUDA wheel and dependencies are far over what .whl/ can carry, so an image
#               without it gets an error naming what is missing; about 4 minutes on an H100-class
#               machine when present (engine starts included), not yet run on a GPU
# and writes each part's output, with the machine and the versions, to gpu-check-<part>.md in
# $OUT when set (the device tool brings that folder back) or else in benchmarks/results/.
# Each part fits the device tool's 10-minute command limit on an H100; run them as separate
# commands when time is short.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dry=0
parts=()
for arg in "$@"; do
    case "$arg" in
        --dry-run) dry=1 ;;
        tests|step|generation|profile|memory|vllm) parts+=("$arg") ;;
        all) parts+=(tests step generation profile memory) ;;
        *) echo "usage: scripts/gpu-check.sh [--dry-run] [tests|step|generation|profile|memory|vllm|all]" >&2
           exit 2 ;;
    esac
done
[ ${#parts[@]} -eq 0 ] && parts=(tests step generation profile memory)
out="${OUT:-benchmarks/results}"
mkdir -p "$out"

if [ $dry -eq 1 ]; then
    python="${MTGRPO_PYTHON:-.venv/bin/python}"
    step_args=(--workload cpu-tiny --steps 2 --block 1 --num-prompts 2 --group-size 2
               --max-new-tokens 4 --prompt-tokens 8 --micro-batch 2 --hidden-size 64
               --num-layers 2 --num-heads 4 --num-kv-heads 2 --intermediate-size 128)
    generation_args=(--device cpu --models tiny --rows 4 --new-tokens 4 --repeats 1)
    profile_args=(--workload cpu-tiny --num-prompts 2 --group-size 2 --max-new-tokens 4
                  --prompt-tokens 8 --micro-batch 2 --hidden-size 64 --num-layers 2
                  --num-heads 4 --num-kv-heads 2 --intermediate-size 128 --warmup 1 --rows 10)
    memory_args=(--quick)
    vllm_python="${MTGRPO_VLLM_PYTHON:-.venv-vllm/bin/python}"
    vllm_tests=(tests/rollout/test_vllm_engine.py -k "greedy or logprobs")
    vllm_generation_args=(--device cpu --models tiny-vllm --rows 4 --num-samples 2
                          --new-tokens 8 --repeats 1 --backend vllm)
else
    python="${MTGRPO_PYTHON:-python3}"
    if ! "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
        echo "[gpu-check] no CUDA device visible to $python; use --dry-run on a CPU" >&2
        exit 1
    fi
    if [ ! -d .whl ] || ! ls .whl/*.whl >/dev/null 2>&1; then
        echo "[gpu-check] no .whl/: build it where there is network with" \
             "'python scripts/gpu_wheelhouse.py' and carry it (device tool: carry ['.whl'])" >&2
        exit 1
    fi
    site=/tmp/mtgrpo-site
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" .whl/*.whl || exit 1
    export PYTHONPATH="$site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
    step_args=(--workload gpu-qwen0.5b --trl-defaults)
    generation_args=(--device cuda --models qwen2.5-0.5b-shape --rows 64 --new-tokens 256
                     --prompt-tokens 48 --repeats 5)
    profile_args=(--workload gpu-qwen0.5b)
    memory_args=(--models qwen2.5-0.5b)
    vllm_python="${MTGRPO_VLLM_PYTHON:-$python}"
    vllm_tests=(tests/rollout/test_vllm_engine.py tests/trainer/test_trainer_vllm.py)
    vllm_generation_args=(--device cuda --models qwen2.5-0.5b-shape --rows 64 --new-tokens 256
                          --prompt-tokens 48 --repeats 5 --backend vllm)
fi
export PYTHONUNBUFFERED=1

header() {
    echo "# GPU check: $1"
    echo
    echo "Command: \`scripts/gpu-check.sh $([ $dry -eq 1 ] && echo '--dry-run ')$1\` ($(date -u +%FT%TZ))"
    echo
    "$python" - <<'PY'
import platform, torch, transformers
try:
    import trl; trl_version = trl.__version__
except ImportError:
    trl_version = "not installed"
device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu"
print(f"Machine: {device}; Python {platform.python_version()}; torch {torch.__version__}; "
      f"transformers {transformers.__version__}; trl {trl_version}")
PY
    echo
}

status=0
for part in "${parts[@]}"; do
    file="$out/gpu-check-$part.md"
    echo "[gpu-check] $part -> $file" >&2
    {
        header "$part"
        echo '```'
        case "$part" in
            tests) "$python" -m pytest -q -p no:cacheprovider tests/fast/test_static_gpu.py ;;
            step) "$python" benchmarks/step_time_vs_trl.py "${step_args[@]}" ;;
            generation) "$python" benchmarks/generation_speed.py "${generation_args[@]}" ;;
            profile) "$python" benchmarks/profile_step.py "${profile_args[@]}" ;;
            memory) "$python" benchmarks/update_memory.py "${memory_args[@]}" ;;
            vllm)
                if ! "$vllm_python" -c "import vllm" 2>/dev/null; then
                    echo "vLLM does not import in $vllm_python: install vLLM 0.32 for this"
                    echo "torch (pip install 'vllm==0.32.*', needs network) or set"
                    echo "MTGRPO_VLLM_PYTHON to an interpreter that has it"
                    false
                else
                    "$vllm_python" -m pytest -q -p no:cacheprovider -m vllm "${vllm_tests[@]}" \
                        && "$vllm_python" benchmarks/generation_speed.py \
                            "${vllm_generation_args[@]}"
                fi ;;
        esac
        rc=$?
        echo '```'
        echo
        echo "Exit status: $rc"
    } > "$file" 2>&1
    grep -q "^Exit status: 0$" "$file" || status=1
    tail -5 "$file" >&2
done
exit $status
