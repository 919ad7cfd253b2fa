#!/usr/bin/env bash
# Search the shapes of the peer table (benchmarks/peers_table.py, docs/benchmarks.md) into one storage, so that
# `autotune.attention` runs each shape's searched winner; then export it into the shipped table:
#   STORAGE=sqlite:///$PWD/studies/autotune.db TRIALS=30 benchmarks/tune_peer_shapes.sh
#   autotune export studies/tuned/h200.json --gpu h200 --storage "$STORAGE"
# FAMILY (default wgmma, the family that leads on the H200) and EXTRA (more `autotune search` flags) apply to
# every search. Each search's summary lines (best, stored, baselines) go to stdout, everything to $LOG.
set -u
cd "$(dirname "$0")/.."
STORAGE=${STORAGE:-sqlite:///$PWD/studies/autotune.db}
TRIALS=${TRIALS:-30}
FAMILY=${FAMILY:-wgmma}
EXTRA=${EXTRA:-}
LOG=${LOG:-/dev/null}
run() {
  echo "== autotune search $*" | tee -a "$LOG"
  # shellcheck disable=SC2086  # EXTRA is a word list on purpose
  python3 -m autotune.cli search --trials "$TRIALS" --family "$FAMILY" --storage "$STORAGE" $EXTRA "$@" 2>&1 \
    | tee -a "$LOG" | grep -E "^  (best|stored|sdpa|fa4|stopped)"
}
run --seqlen 4096 --batch 4 --heads 16 --head-dim 128
run --seqlen 4096 --batch 4 --heads 16 --head-dim 128 --causal
run --seqlen 4096 --batch 4 --heads 32 --head-dim 64
run --seqlen 4096 --batch 4 --heads 16 --head-dim 128 --dtype bf16
run --seqlen 1024 --batch 1 --heads 64 --head-dim 128
run --seqlen 512 --batch 16 --heads 16 --head-dim 64
run --seqlen 4096 --batch 2 --heads 8 --head-dim 256 --dtype bf16
