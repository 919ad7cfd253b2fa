#!/usr/bin/env bash
# Retune the shipped H200 table over the shape matrix (studies/campaigns/h200-matrix.toml), resumably, within one
# GPU-host command of at most 10 minutes: run it again (with the storage that came back) and it goes on where the
# last run stopped (finished shapes skipped, a shape cut half-way resumed).
#
#   benchmarks/campaign_h200.sh [DEADLINE_S]        # default 540: the campaign stops cleanly within it
#
# Environment: CAMPAIGN_DB (default studies/campaign-h200.db, git-ignored: carry it; absent = a fresh campaign),
# CAMPAIGN_FILE (default the matrix), EXTRA (more `autotune campaign` flags), OUT (default ./campaign-out).
# Writes to $OUT: the storage (campaign-h200.db: a consistent copy after every shape, so a run killed at the limit
# still returns its finished shapes), the whole log (campaign.log, written as it runs) and the closing table
# (campaign-table.md). Stdout: the progress line of each shape, its best/stored lines, and the table.
#
# While it runs the storage lives on tmpfs (/dev/shm): each Optuna ask and tell is a series of SQLite commits,
# and on a disk their fsyncs made the campaign's own overhead 3-5× larger (benchmarks/campaign_dry_run.py).
#
# Afterwards, on the workstation: copy $OUT/campaign-h200.db to studies/campaign-h200.db (the next run's carry);
# once every shape is finished:
#   autotune export studies/tuned/h200.json --gpu h200 --merge --storage sqlite:///studies/campaign-h200.db
set -u
cd "$(dirname "$0")/.."
DEADLINE_S=${1:-540}
DB=${CAMPAIGN_DB:-studies/campaign-h200.db}
FILE=${CAMPAIGN_FILE:-studies/campaigns/h200-matrix.toml}
OUT=${OUT:-$PWD/campaign-out}
EXTRA=${EXTRA:-}
started=$(date +%s)
mkdir -p "$OUT" "$(dirname "$DB")"
LIVE_DIR=/dev/shm/autotune-campaign
[ -d /dev/shm ] || LIVE_DIR=$PWD/.cache/campaign
mkdir -p "$LIVE_DIR"
LIVE=$LIVE_DIR/campaign-h200.db
# The kernel cache lives in the (ignored) .cache/ of the checkout: a warm GPU host keeps it between commands.
export AUTOTUNE_CACHE_DIR=${AUTOTUNE_CACHE_DIR:-$PWD/.cache/kernels}

backup() {  # sqlite3's backup API: a consistent copy even of a database left mid-transaction
  python3 - "$1" "$2" <<'PY'
import os, sqlite3, sys
src, dst = sys.argv[1], sys.argv[2]
if os.path.exists(src):
    a, b = sqlite3.connect(src), sqlite3.connect(dst + ".tmp")
    a.backup(b)
    a.close(); b.close()
    os.replace(dst + ".tmp", dst)
PY
}

{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, optuna; print('torch', torch.__version__, 'optuna', optuna.__version__)"
  if [ -f "$DB" ]; then echo "resuming from $DB"; else echo "no $DB: a fresh campaign"; fi
} >"$OUT/campaign.log" 2>&1
rm -f "$LIVE"
backup "$DB" "$LIVE"
# Whatever start-up cost is already spent comes off the campaign's budget.
budget=$((DEADLINE_S - ($(date +%s) - started)))
# shellcheck disable=SC2086  # EXTRA is a word list on purpose
python3 -m autotune.cli campaign "$FILE" --storage "sqlite:///$LIVE" --budget-s "$budget" \
  --warm-from studies/tuned/h200.json --snapshot "$OUT/campaign-h200.db" --markdown "$OUT/campaign-table.md" \
  $EXTRA 2>&1 | tee -a "$OUT/campaign.log" | grep -E "^campaign|^== campaign|^  (best|stored):"
code=${PIPESTATUS[0]}
# The campaign snapshots after every shape and at its end; these copies also cover a run that died on its own.
backup "$LIVE" "$OUT/campaign-h200.db" || echo "campaign_h200.sh: could not copy $LIVE to $OUT" | tee -a "$OUT/campaign.log"
backup "$LIVE" "$DB" || true
echo
cat "$OUT/campaign-table.md" 2>/dev/null
echo "campaign_h200.sh: exit $code after $(($(date +%s) - started)) s; storage, log and table in $OUT" | tee -a "$OUT/campaign.log"
exit "$code"
