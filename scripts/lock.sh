#!/usr/bin/env bash
# Re-locks the tested versions: writes requirements/lock.txt, the exact versions ./run.sh and
# ./test.sh install (scripts/setup-env.sh passes it to pip as constraints). One file serves
# every supported Python and platform: where the newest admitted release differs by Python
# (numpy, scipy, ...) it holds one line per Python with an environment marker.
#
#   scripts/lock.sh                         # resolve the newest versions pyproject.toml admits
#   scripts/lock.sh 'transformers==5.23.0'  # ... with extra pins (any pip requirement strings)
#
# Re-lock on purpose, never as a side effect: when a dependency's new release is wanted (a fix,
# a feature) or pyproject.toml's ranges change. Then run scripts/test-matrix.sh and the
# README's two commands on the new lock, re-measure what the README reports, and commit the
# lock with the figures it produced. The resolution is uv's (`uv pip compile`, fetched into a
# throw-away venv); torch stays at the locked version unless MTGRPO_TORCH_VERSION says otherwise.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
lock="$root/requirements/lock.txt"
locked_torch="$( [ -f "$lock" ] && sed -n 's/^torch==\([^ ;]*\).*/\1/p' "$lock" | head -1 )"
torch_version="${MTGRPO_TORCH_VERSION:-${locked_torch:-2.13.0}}"
tools="$(mktemp -d)"
trap 'rm -rf "$tools"' EXIT

python3 -m venv "$tools/venv"
"$tools/venv/bin/python" -m pip --disable-pip-version-check -q install "uv==0.13.9"
extra="$tools/extra.txt"
printf '%s\n' "torch==$torch_version" "$@" > "$extra"
out="$lock"
minimum="$(sed -n 's/^requires-python = ">=\([0-9.]*\)".*/\1/p' "$root/pyproject.toml")"
echo "[lock] Python >= $minimum, every platform -> ${out#"$root"/}" >&2
(cd "$root" && "$tools/venv/bin/uv" pip compile pyproject.toml \
    --extra dev --extra gguf --extra bench --extra deepspeed \
    --constraint "$extra" \
    --python-version "$minimum" --universal \
    --index-url https://pypi.org/simple \
    --no-header --no-annotate --quiet \
    --output-file "$out.new")
{ echo "# Tested versions, written by scripts/lock.sh on $(date -u +%F) (extra pins: $(tr '\n' ' ' < "$extra"))."
  echo "# scripts/setup-env.sh installs them as pip constraints; re-lock only with scripts/lock.sh."
  cat "$out.new"; } > "$out"
rm "$out.new"
