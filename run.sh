#!/usr/bin/env bash
# Sets up .venv (first run only) and runs the main job: the CPU quickstart (mtgrpo train quickstart).
# Extra arguments are config overrides, e.g. ./run.sh --max_steps 50
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup-env.sh
exec .venv/bin/mtgrpo train quickstart "$@"
