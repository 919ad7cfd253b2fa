# Sourced by the GPU checklists (benchmarks/*_checklist.sh): OUT and the test kernel cache, and step().
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p "$OUT"
export AUTOTUNE_TEST_CACHE_DIR=${AUTOTUNE_TEST_CACHE_DIR:-/tmp/autotune-test-cache}
step() {  # step NAME SECONDS CMD...: run, keep the log, print its tail
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc $rc, $((SECONDS - t0)) s"
  tail -n "${TAIL:-45}" "$OUT/$name.log"
}
