#!/usr/bin/env bash
# The decode work's GPU checklist on the GPU host (results under $OUT), in steps that each fit one run:
#   bash benchmarks/decode_checklist.sh sweep   the decode table with its config sweep (OUT/decode/decode-rows.json:
#                                               the fastest config per decode row, `autotune export` format)
#   bash benchmarks/decode_checklist.sh tests   the decode, wgmma and mma_sync correctness matrices
#   bash benchmarks/decode_checklist.sh final   the peers table as users get it (shipped tables), prefill and decode
#                                               rows in one process (peers_table.py --decode), the runtime GPU tests
#   bash benchmarks/decode_checklist.sh promotion   prefill with the K/V maps' L2 promotion none against the product's
#                                               256B (benchmarks/peers_table.py twice, our column only differs)
#   bash benchmarks/decode_checklist.sh campaign [SECONDS]
#                                               resume the decode campaign (studies/campaigns/h200-decode.toml) from
#                                               studies/campaign-h200-decode.db (carry it; git-ignored) within
#                                               SECONDS (default 540); storage and table under OUT; afterwards merge
#                                               its rows: autotune export studies/tuned/h200-decode.json --merge
#                                               --storage sqlite:///studies/campaign-h200-decode.db
# Each step has its own time limit so one slow step cannot take the others' share.
OUT=${OUT:-/tmp/decode-out}
source "$(dirname "$0")/checklist_lib.sh"  # OUT made, cd to the checkout, step()
case "${1:-}" in
  sweep)
    step decode_sweep 240 python3 benchmarks/decode_table.py --sweep --copy --out "$OUT/decode"
    cp "$OUT/decode/decode-rows.json" /tmp/decode-rows.json 2>/dev/null ;;
  tests)
    prebuild_plans test_decode_gpu test_wgmma_gpu
    TAIL=6 step decode_tests 150 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_decode_gpu.py --maxfail=30
    TAIL=8 step wgmma_tests 220 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_wgmma_gpu.py --maxfail=30
    TAIL=8 step kernel_tests 150 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_kernel_gpu.py --maxfail=30 ;;
  final)
    TAIL=60 step peers_all 420 python3 benchmarks/peers_table.py --decode --out "$OUT/peers"
    TAIL=8 step runtime_tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_runtime_gpu.py --maxfail=30 ;;
  promotion)
    step peers_256B 240 python3 benchmarks/peers_table.py --out "$OUT/peers-256B"
    step peers_none 240 python3 benchmarks/peers_table.py --kv-l2-promotion none --out "$OUT/peers-none" ;;
  campaign)
    CAMPAIGN_FILE=studies/campaigns/h200-decode.toml CAMPAIGN_DB=studies/campaign-h200-decode.db \
      EXTRA="--warm-from studies/tuned/h200-decode.json" OUT="$OUT/campaign" \
      bash benchmarks/campaign_h200.sh "${2:-540}" ;;
  *) echo "usage: $0 sweep|tests|final|promotion|campaign [SECONDS]" >&2; exit 2 ;;
esac
