#!/usr/bin/env bash
# The decode work's GPU checklist in one run on the GPU host (results under $OUT): the decode table with its config
# sweep, the decode correctness matrix, then the wgmma, mma_sync and runtime matrices (kernels and the launch path
# changed). Each step has its own time limit so one slow step cannot take the others' share.
#   bash benchmarks/decode_checklist.sh [table|tests|all]   (default all)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/decode-out}
mkdir -p "$OUT"
export AUTOTUNE_TEST_CACHE_DIR=${AUTOTUNE_TEST_CACHE_DIR:-/tmp/autotune-test-cache}
what=${1:-all}
step() {  # step NAME SECONDS CMD...: run, keep the log, print its tail
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc $rc, $((SECONDS - t0)) s"
  tail -n 45 "$OUT/$name.log"
}
if [ "$what" = table ] || [ "$what" = all ]; then
  step decode_table 240 python3 benchmarks/decode_table.py --sweep --copy --eager --out "$OUT/decode"
fi
if [ "$what" = tests ] || [ "$what" = all ]; then
  step decode_tests 200 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_decode_gpu.py --maxfail=30
  step wgmma_tests 240 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_wgmma_gpu.py --maxfail=30
fi
if [ "$what" = more ]; then
  step kernel_tests 200 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_kernel_gpu.py --maxfail=30
  step runtime_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_runtime_gpu.py --maxfail=30
fi
