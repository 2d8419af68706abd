#!/usr/bin/env bash
# What a session with a GPU carries to the device machine, made here before the machine starts (the
# device reaches no registry, and its minutes are the session's scarcest): the Python packages our side
# needs that the device lacks, the reference's checkout, its packages and a `python` for
# `bench_reference.py --venv`. Prints the carry list and the commands to run there.
#
#   bash docs/issues/007-step-limit/prepare_gpu.sh /work/.mirror/samuelstevens+birdjepa/repo [3.12]
#
# The first argument: a git directory of samuelstevens/birdjepa (the `fetch` tool's mirror); the
# second: the device's Python (3.12 on the H200 machines so far). Everything lands in folders that
# .git/info/exclude ignores: nothing of it is ever committed.
set -euo pipefail
MIRROR=${1:?a git directory of samuelstevens/birdjepa}
PY=${2:-3.12}
REFERENCE_COMMIT=ea03107  # the commit docs/benchmarks.md measured
cd "$(git rev-parse --show-toplevel)"
mkdir -p .git/info
for p in .whl .reference .reference-whl .reference-venv; do
  grep -qxF "/$p" .git/info/exclude 2>/dev/null || echo "/$p" >> .git/info/exclude
done

download() {  # wheels for the device's Python on x86-64 Linux, without their dependencies
  local into=$1; shift
  rm -rf "$into"
  .venv/bin/python -m pip download -q --only-binary=:all: --no-deps --python-version "$PY" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$into" "$@"
}

# Ours: what the device's JAX, flax, optax, orbax, pyarrow and numpy leave missing (tqdm too, which a
# stand-in of that machine lacked), at uv.lock's pins.
ours=$(.venv/bin/uv export --frozen --no-hashes --no-emit-project --extra dev \
  | grep -E '^(tyro|docstring-parser|typeguard|soundfile|cffi|pycparser|tqdm)==' | cut -d' ' -f1 | tr '\n' ' ')
# shellcheck disable=SC2086
download .whl $ours

# The reference's step imports beartype, chex, equinox, jaxtyping (on the device), grain (with
# array_record, portpicker, cloudpickle), orbax, tyro (ours, above) and wandb (only imported: a
# stand-in below). Unpinned: its own scratch environment.
download .reference-whl beartype chex toolz grain array-record portpicker cloudpickle
rm -rf .reference && mkdir .reference
git --git-dir="$MIRROR" archive "$REFERENCE_COMMIT" | tar -x -C .reference

# `bench_reference.py --venv .reference-venv` runs DIR/bin/python with PYTHONPATH set to the
# reference's src alone: this python adds the carried packages (installed under /tmp by the device
# command below) and a wandb that fails on use, never on import.
rm -rf .reference-venv && mkdir -p .reference-venv/bin .reference-venv/stub/wandb
for m in __init__ util; do
  printf 'def __getattr__(name):\n    raise ImportError("wandb is a stand-in here: the timed step never logs")\n' \
    > ".reference-venv/stub/wandb/$m.py"
done
cat > .reference-venv/bin/python <<'EOF'
#!/bin/sh
here=$(cd "$(dirname "$0")/.." && pwd)
PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}/tmp/site-ref:/tmp/site:$here/stub" exec python3 "$@"
EOF
chmod +x .reference-venv/bin/python

echo "carry: src/birdjepa/_rs.abi3.so .whl .reference .reference-whl .reference-venv ($(du -sch .whl .reference .reference-whl .reference-venv | tail -1 | cut -f1))"
cat <<'EOF'
on the device, first (installs what was carried; seconds):
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && python3 -m pip install -q --no-index --no-deps --target /tmp/site-ref .reference-whl/*.whl
then, in the same call (timeout_s 590; each section's rows land in $OUT/gpu_check.json as it ends):
  PYTHONPATH=$PWD/src:/tmp/site python3 scripts/gpu_check.py --sections step reference conds loader --reference .reference --reference-venv .reference-venv --budget-s 480 --json $OUT/gpu_check.json
EOF
