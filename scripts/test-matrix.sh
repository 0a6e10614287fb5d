#!/usr/bin/env bash
# Runs the tests of the code that follows transformers' internals (generation, log-probs,
# trainer, transformers compatibility) against several transformers releases, each in a
# throw-away venv with every other dependency at its locked version.
#
#   scripts/test-matrix.sh                     # oldest admitted, locked, newest on PyPI
#   scripts/test-matrix.sh 5.20.0 locked       # chosen releases ("oldest", "locked", "newest"
#                                              # or a version number)
#   MTGRPO_MATRIX_TORCH="2.5.1 newest" scripts/test-matrix.sh locked
#                                              # also vary torch (PyPI's CUDA builds: GBs)
#   MTGRPO_MATRIX_TESTS="tests/rollout" ...     # another test selection
#
# Venvs live in $MTGRPO_MATRIX_DIR (default /tmp/mtgrpo-matrix), one per combination, and are
# reused while their versions stay the same (MTGRPO_MATRIX_FRESH=1 rebuilds them). Prints a
# table (also written to $MTGRPO_MATRIX_DIR/table.md) and exits non-zero if any row failed.
# Run it before every submission and when re-locking; CI stays on the lock (./test.sh).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
lock="$root/requirements/lock.txt"
dir="${MTGRPO_MATRIX_DIR:-/tmp/mtgrpo-matrix}"
tests=(${MTGRPO_MATRIX_TESTS:-tests/algo tests/fast tests/rollout tests/policy tests/trainer})
py="${MTGRPO_PYTHON:-python3}"
extras="dev,gguf,bench,deepspeed"  # as scripts/setup-env.sh installs (DeepSpeed without its ops)
mkdir -p "$dir"

locked() { sed -n "s/^$1==\([^ ;]*\).*/\1/p" "$lock" | head -1; }
floor() { sed -n "s/^ *\"$1>=\([0-9.]*\).*/\1/p" "$root/pyproject.toml" | head -1; }
newest() {
    "$py" -m pip index versions "$1" 2>/dev/null | sed -n "s/^$1 (\(.*\))$/\1/p" | head -1
}
resolve() {  # resolve PACKAGE SPEC -> version
    case "$2" in
        oldest) floor "$1" ;;
        locked) locked "$1" ;;
        newest) newest "$1" ;;
        *) echo "$2" ;;
    esac
}

transformers_specs=("$@")
[ ${#transformers_specs[@]} -eq 0 ] && transformers_specs=(oldest locked newest)
torch_specs=(${MTGRPO_MATRIX_TORCH:-locked})
# Constraints: the lock without the packages each row chooses and what they pin in turn.
constraints="$dir/constraints.txt"
grep -v -E '^(transformers|tokenizers|huggingface-hub|torch|nvidia-|cuda-|triton)[=]' "$lock" \
    > "$constraints"

table="$dir/table.md"
{ echo "| transformers | torch | tests | result | seconds |"
  echo "|---|---|---|---|---:|"; } > "$table"
status=0
declare -A done_rows  # "transformers torch" -> the table cells of a combination already run
for torch_spec in "${torch_specs[@]}"; do
    torch_version="$(resolve torch "$torch_spec")"
    for spec in "${transformers_specs[@]}"; do
        version="$(resolve transformers "$spec")"
        if [ -z "$version" ] || [ -z "$torch_version" ]; then
            echo "[matrix] cannot resolve transformers '$spec' / torch '$torch_spec'" >&2
            status=1
            continue
        fi
        if [ -n "${done_rows["$version $torch_version"]:-}" ]; then  # e.g. locked = newest
            echo "| $version ($spec) | $torch_version ($torch_spec) | ${done_rows["$version $torch_version"]} |" >> "$table"
            continue
        fi
        venv="$dir/venv-tf$version-torch$torch_version"
        [ "${MTGRPO_MATRIX_FRESH:-0}" = 1 ] && rm -rf "$venv"
        # the stamp names the extras installed: a venv built with others is rebuilt
        if [ "$(cat "$venv/.ready" 2>/dev/null)" != "$extras" ]; then
            echo "[matrix] building $venv" >&2
            rm -rf "$venv"
            "$py" -m venv "$venv"
            pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
            "${pip[@]}" install "torch==$torch_version" \
                && DS_BUILD_OPS=0 "${pip[@]}" install --constraint "$constraints" \
                    -e "$root[$extras]" "transformers==$version" \
                && echo "$extras" > "$venv/.ready" \
                || { echo "[matrix] install failed: transformers $version, torch $torch_version" >&2
                     echo "| $version ($spec) | $torch_version ($torch_spec) | - | install failed | - |" >> "$table"
                     status=1; continue; }
        fi
        echo "[matrix] transformers $version ($spec), torch $torch_version ($torch_spec)" >&2
        start=$(date +%s)
        log="$dir/pytest-tf$version-torch$torch_version.log"
        (cd "$root" && OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" "$venv/bin/python" -m pytest -q \
            -p no:cacheprovider "${tests[@]}" > "$log" 2>&1)
        rc=$?
        seconds=$(( $(date +%s) - start ))
        summary="$(tail -1 "$log" | sed 's/^=* *//; s/ *=*$//')"
        [ $rc -ne 0 ] && status=1
        done_rows["$version $torch_version"]="${tests[*]} | $summary (the row above) | -"
        echo "| $version ($spec) | $torch_version ($torch_spec) | ${tests[*]} | $summary | $seconds |" >> "$table"
        echo "[matrix]   $summary ($seconds s; log: $log)" >&2
    done
done
cat "$table"
exit $status
