#!/usr/bin/env bash
# Sets up .venv (first run only) and runs the main job.
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup-env.sh
exec .venv/bin/mtgrpo analyze "$@"
