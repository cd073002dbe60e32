#!/usr/bin/env bash
# The GPU tier in one call, for the GPU machine: `pytest -m gpu` split over parallel processes
# (each Triton/NVRTC program compiles once, so serial runs are compile-bound), then `kermac bench`.
# Logs and the benchmark table go to $OUT (default ./gpu-logs).  Exit status: the tests'.
# Usage (after installing the workspace): bash scripts/gpu-suite.sh [--no-bench]
set -uo pipefail
out=${OUT:-gpu-logs}
mkdir -p "$out"
export KERMAC_CACHE_DIR=${KERMAC_CACHE_DIR:-/tmp/kermac-gpu-suite-cache}
export KERMAC_REQUIRE_BACKENDS=${KERMAC_REQUIRE_BACKENDS:-nvrtc,triton}

# name | pytest arguments (every group runs with -m gpu)
groups=(
  "nvrtc|tests -k nvrtc"
  "triton-cdist|tests/test_cdist.py -k triton"
  "triton-rest|tests -k triton and not test_cdist.py"
  "others|tests -k not nvrtc and not triton"
)
pids=()
for g in "${groups[@]}"; do
  name=${g%%|*}
  args=${g#*|}
  files=${args%% -k *}
  expr=${args#* -k }
  python3 -m pytest -q -m gpu -p no:cacheprovider $files -k "$expr" >"$out/pytest-$name.log" 2>&1 &
  pids+=("$!")
done
status=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || status=1
done
for g in "${groups[@]}"; do
  name=${g%%|*}
  printf '%-13s %s\n' "$name" "$(tail -n 1 "$out/pytest-$name.log")"
done
grep -h -E "^(FAILED|ERROR)" "$out"/pytest-*.log | head -40

if [ "${1:-}" != "--no-bench" ]; then
  python3 -m kermac info >"$out/info.txt" 2>&1
  # The tests run Triton untuned (one compilation per program); the benchmark measures what a
  # user gets: autotuned tiles.
  python3 -m kermac bench >"$out/bench.txt" 2>"$out/bench-progress.log"
  cat "$out/bench.txt"
fi
exit $status
