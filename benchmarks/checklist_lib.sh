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
gpu_matrix() {  # gpu_matrix STEP LIMIT_S MODULE...: tests/ modules' GPU matrices in one pytest, their kernels built
  # first in one process. MATRIX_SELECT=AXIS=VALUE: only the configs with that axis value (built and tested; the
  # test ids hold the config's values, so pytest -k VALUE picks them); MATRIX_K: the -k expression instead, where
  # the value alone is not unique in the ids (a bool axis: True is built, its id says 1)
  local name=$1 limit=$2; shift 2
  local select=()
  [ -n "${MATRIX_SELECT:-}" ] && select=(-k "${MATRIX_K:-${MATRIX_SELECT#*=}}")
  prebuild_plans "$@"
  TAIL=8 step "$name" "$limit" python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider $(printf "tests/%s.py " "$@") \
    --maxfail=30 "${select[@]}"
}
prebuild_plans() {  # prebuild_plans MODULE...: the kernels of the named tests/ modules' PLANs, built once in one
  # process (under -n 8 every xdist worker would build a whole plan at once, eight ninja runs over one cache)
  TAIL=4 step prebuild 200 python3 -c "
import os, sys; sys.path.insert(0, 'tests')
import importlib, space
from autotune.build.builder import Builder
axis, _, value = os.environ.get('MATRIX_SELECT', '').partition('=')
items = list(dict.fromkeys((c, p) for m in sys.argv[1:] for p, c in importlib.import_module(m).PLAN
                           if not axis or str(c.as_dict().get(axis)) == value))
res = Builder(space.get_arch('sm_90'), cache_dir=os.environ['AUTOTUNE_TEST_CACHE_DIR'], jobs=os.cpu_count()).build(items)
print(len(res), 'builds,', sum(not r.ok or r.spilled for r in res), 'failed or spilled')" "$@"
}
