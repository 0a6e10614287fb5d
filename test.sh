#!/usr/bin/env bash
# Sets up .venv (first run only), lints, and runs the whole test suite; then sets up .venv-vllm
# (first run only: vLLM's tested pins, requirements/lock-vllm.txt) and runs the tests marked
# vllm, which need the real vLLM, in it (they skip in the first run).
# Extra arguments go to pytest, e.g. ./test.sh -k advantages   or   ./test.sh -m slow
# (a -m of your own runs only the first pass).
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup-env.sh
.venv/bin/ruff check src tests benchmarks scripts
status=0
.venv/bin/python -m pytest "$@" || status=$?
for arg in "$@"; do
    if [ "$arg" = "-m" ]; then
        exit "$status"
    fi
done
scripts/setup-vllm-env.sh
echo "[test] the tests marked vllm, against the real vLLM in .venv-vllm"
vllm_status=0
.venv-vllm/bin/python -m pytest -m vllm "$@" || vllm_status=$?
# 5 (no test selected) is a failure, except when arguments of the caller (-k, a path)
# selected no vllm test on purpose
if [ "$vllm_status" -ne 0 ] && { [ "$vllm_status" -ne 5 ] || [ $# -eq 0 ]; }; then
    status=$vllm_status
fi
exit "$status"
