#!/usr/bin/env bash
# Sets up .venv (first run only), lints, and runs the whole test suite.
# Extra arguments go to pytest, e.g. ./test.sh -k advantages   or   ./test.sh -m slow
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup-env.sh
.venv/bin/ruff check src tests benchmarks scripts
.venv/bin/python -m pytest "$@"
