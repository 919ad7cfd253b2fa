#!/usr/bin/env bash
# Search the shapes of the peer table (benchmarks/peers_table.py, docs/benchmarks.md) into one storage, so that
# `autotune.attention` runs each shape's searched winner; then export it into the shipped table:
#   STORAGE=sqlite:///$PWD/studies/autotune.db TRIALS=30 benchmarks/tune_peer_shapes.sh
#   autotune export studies/tuned/h200.json --gpu h200 --storage "$STORAGE"
# FAMILY (default wgmma, the family that leads on the H200) and EXTRA (more `autotune search` flags) apply to
# every search. Each search first tries the config `autotune.attention` runs today for that shape under every
# tile scheduler (the axis is new: the sampler would otherwise meet it only by chance in a short search).
# Each search's summary lines (best, stored, baselines, time) go to stdout, everything to $LOG.
set -u
cd "$(dirname "$0")/.."
STORAGE=${STORAGE:-sqlite:///$PWD/studies/autotune.db}
TRIALS=${TRIALS:-30}
FAMILY=${FAMILY:-wgmma}
EXTRA=${EXTRA:-}
LOG=${LOG:-/dev/null}
# today's config for a shape (search flags as arguments) under each scheduler, as --enqueue flags
todays_configs() {
  python3 - "$@" <<'PY'
import sys
import torch
import autotune
from autotune.commands.check_cmd import add_shape_arguments, shape_from_args
import argparse
ap = argparse.ArgumentParser()
add_shape_arguments(ap, seqlen=4096, batch=4, heads=16)
shape = shape_from_args(ap.parse_args(sys.argv[1:]), "tune_peer_shapes")
dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[shape.dtype]
q = torch.empty(shape.batch, shape.heads, shape.seqlen_q, shape.head_dim, device="meta", dtype=dtype)
key = autotune.explain(q, q, q, causal=shape.causal, gpu_name="NVIDIA H200", arch="sm_90").splitlines()[0].split()[-1]
if key.startswith("wgmma:"):
    base = key.split(",scheduler=")[0]
    print(" ".join(f"--enqueue {base},scheduler={s}" for s in ("grid", "lpt", "persistent")))
PY
}
run() {
  echo "== autotune search $*" | tee -a "$LOG"
  # shellcheck disable=SC2086,SC2046  # EXTRA and the enqueue flags are word lists on purpose
  python3 -m autotune.cli search --trials "$TRIALS" --family "$FAMILY" --storage "$STORAGE" $EXTRA \
    $(todays_configs "$@") "$@" 2>&1 | tee -a "$LOG" | grep -E "^  (best|stored|sdpa|fa4|stopped)|^time:"
}
run --seqlen 4096 --batch 4 --heads 16 --head-dim 128
run --seqlen 4096 --batch 4 --heads 16 --head-dim 128 --causal
run --seqlen 4096 --batch 4 --heads 32 --head-dim 64
run --seqlen 4096 --batch 4 --heads 16 --head-dim 128 --dtype bf16
run --seqlen 1024 --batch 1 --heads 64 --head-dim 128
run --seqlen 512 --batch 16 --heads 16 --head-dim 64
run --seqlen 4096 --batch 2 --heads 8 --head-dim 256 --dtype bf16
