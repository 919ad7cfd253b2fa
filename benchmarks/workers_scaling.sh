#!/usr/bin/env bash
# Distributed search on a GPU host, in one command (docs/distributed.md):
#
#   1. scaling: the same budget on shape 1 with 1 worker, then with 2 workers (one per GPU), each from an empty
#      kernel cache and a fresh study, so the only difference is the second worker;
#   2. warm start: shape 2 (a neighbour of shape 1, which is now tuned) searched warm-started from shape 1's
#      best configs, then cold, same budget and seed; "best at" is how many evaluated trials each took to reach
#      its best. (The same kernel cache for both: their wall times are not comparable, their trial counts are.)
#
# A throwaway PostgreSQL cluster (initdb/pg_ctl, 127.0.0.1) holds everything unless AUTOTUNE_BENCH_STORAGE names
# a server to use instead. Needs 2 GPUs for the 2-worker row (with one it still runs: both workers share it).
#
#   benchmarks/workers_scaling.sh                       # defaults below
#   TRIALS=60 SEQLEN=4096 SEQLEN2=8192 benchmarks/workers_scaling.sh
set -euo pipefail
cd "$(dirname "$0")/.."

TRIALS=${TRIALS:-40}          # evaluated trials per run
SEQLEN=${SEQLEN:-4096}        # shape 1
SEQLEN2=${SEQLEN2:-8192}      # shape 2: distance 1 from shape 1 (log2 seqlen)
SHAPE=${SHAPE:---batch 4 --heads 16 --head-dim 128 --dtype fp16}
WARM=${WARM:-4}               # configs the warm-started study tries first
EXTRA=${EXTRA:-}              # more `autotune search` flags for every run (e.g. --family mma_sync)
LOG_DIR=${LOG_DIR:-}          # where runs.log and results.tsv go (default: the work folder; e.g. $OUT on a GPU host)

work=$(mktemp -d /tmp/autotune-workers-bench.XXXXXX)
chmod 755 "$work"
log="${LOG_DIR:-$work}/runs.log"
results="${LOG_DIR:-$work}/results.tsv"
[[ -n "$LOG_DIR" ]] && mkdir -p "$LOG_DIR"
: >"$log"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name --format=csv,noheader | tee -a "$log"
: >"$results"

pg_stop() { :; }
if [[ -n "${AUTOTUNE_BENCH_STORAGE:-}" ]]; then
  url=$AUTOTUNE_BENCH_STORAGE
else
  initdb=$(command -v initdb || ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -1)
  [[ -x "$initdb" ]] || { echo "initdb not found: apt-get install postgresql, set AUTOTUNE_BENCH_STORAGE, or on a" \
    "host without a package index: eval \"\$(benchmarks/gpu_host_postgres.sh unpack)\"" >&2; exit 2; }
  bin=$(dirname "$(readlink -f "$initdb")")  # createdb sits next to the real initdb, not always on PATH
  as=()
  if [[ $(id -u) == 0 ]]; then  # PostgreSQL refuses to run as root
    chown postgres "$work" 2>/dev/null && as=(runuser -u postgres --) || { chown nobody "$work"; as=(runuser -u nobody --); }
  fi
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "${as[@]}" "$bin/initdb" -D "$work/pg" -U autotune -A trust --no-sync >/dev/null
  "${as[@]}" "$bin/pg_ctl" -D "$work/pg" -l "$work/pg.log" -w \
      -o "-p $port -k $work -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" start >/dev/null
  pg_stop() { "${as[@]}" "$bin/pg_ctl" -D "$work/pg" -m fast -w stop >/dev/null || true; }
  trap 'pg_stop' EXIT
  "$bin/createdb" -h 127.0.0.1 -p "$port" -U autotune bench
  url="postgresql://autotune@127.0.0.1:$port/bench"
fi

# run NAME STUDY SEQLEN WORKERS CACHE [flags...]: one `autotune search`, timed; a line into $results
run() {
  local name=$1 study=$2 seqlen=$3 workers=$4 cache=$5
  shift 5
  echo "== $name: autotune search --seqlen $seqlen --workers $workers $*" | tee -a "$log"
  local t0 t1
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086  # SHAPE and EXTRA are word lists on purpose
  python3 -m autotune.cli search --seqlen "$seqlen" $SHAPE --trials "$TRIALS" --storage "$url" --study "$study" \
      --workers "$workers" --cache-dir "$cache" --seed 0 $EXTRA "$@" >>"$log" 2>&1 \
      || echo "   (exit $?: see $log)"
  t1=$(date +%s.%N)
  echo -e "$name\t$study\t$workers\t$(python3 -c "print(f'{$t1 - $t0:.1f}')")" >>"$results"
}

run "n$SEQLEN, 1 worker" scale-w1 "$SEQLEN" 1 "$work/cache-w1"
run "n$SEQLEN, 2 workers" scale-w2 "$SEQLEN" 2 "$work/cache-w2"
# Warm first: the cold run's winner, stored for shape 2, would otherwise be the warm run's nearest neighbour.
run "n$SEQLEN2 warm-started" shape2-warm "$SEQLEN2" 1 "$work/cache-shape2" --warm-start "$WARM"
run "n$SEQLEN2 cold" shape2-cold "$SEQLEN2" 1 "$work/cache-shape2" --warm-start 0

python3 - "$url" "$results" <<'EOF'
import sys
from collections import Counter

import optuna

from autotune.search import study as studies
from autotune.store import storage_url

url, results = storage_url.prepare(sys.argv[1]), sys.argv[2]
optuna.logging.set_verbosity(optuna.logging.WARNING)
rows = [line.rstrip("\n").split("\t") for line in open(results) if line.strip()]
base = float(rows[0][3]) if rows else None
print(f"\n{'run':<26} {'workers':>7} {'evaluated':>9} {'timed twice':>11} {'wall s':>8} {'speed-up':>8} "
      f"{'best TFLOPS':>11} {'best at':>7} {'re-timed':>8}")
for name, study_name, workers, wall in rows:
    try:
        study = optuna.load_study(study_name=study_name, storage=url)
    except KeyError:
        print(f"{name:<26} {workers:>7} {'-':>9} {'-':>11} {wall:>8}  (no study: the run failed)")
        continue
    timed = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")
             and t.user_attrs.get("status") not in (None, "invalid") and "duplicate_of" not in t.user_attrs]
    # A config measured by two trials (neither reusing the other's result) was timed twice: the claims exist to
    # prevent exactly that. Build failures are not timings.
    keys = Counter(t.user_attrs.get("config_key") for t in timed if "time_ms" in t.user_attrs)
    twice = sum(n - 1 for n in keys.values() if n > 1)
    top = studies.top_trials(study, 1)
    best = f"{top[0].value:.1f}" if top else "-"
    at = studies.trials_to_best(study) or "-"
    retimed = len(study.user_attrs.get("retimed", []))
    speed = f"{base / float(wall):.2f}x" if study_name.startswith("scale") and base else ""
    print(f"{name:<26} {workers:>7} {len(timed):>9} {twice:>11} {float(wall):>8.1f} {speed:>8} {best:>11} "
          f"{at!s:>7} {retimed:>8}")
EOF
echo "logs: $log"
