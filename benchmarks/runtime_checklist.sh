#!/usr/bin/env bash
# The runtime's GPU checklist on the GPU host (results under $OUT), in steps that each fit one run:
#   bash benchmarks/runtime_checklist.sh holds    does the shipped table hold today: every row against its shape's
#                                                 finalists, re-timed in separate rounds (table_holds.py)
#   bash benchmarks/runtime_checklist.sh tests    the launch path's GPU tests: seqused_k in both families (and a
#                                                 StaticCache Llama), the runtime and models tests, the decode matrix
#   bash benchmarks/runtime_checklist.sh models [BUDGET_S]   the whole-model table (models_e2e.py: Llama with its
#                                                 graphed decode rows, the ViT) on the shipped tables with capture on,
#                                                 a campaign over the captured shapes, the table again on its storage
#                                                 (MODELS="vit": one model)
#   bash benchmarks/runtime_checklist.sh host     the warm call's host time (host_overhead.py)
# Each step has its own time limit so one slow step cannot take the others' share.
OUT=${OUT:-/tmp/runtime-out}
source "$(dirname "$0")/checklist_lib.sh"  # OUT made, cd to the checkout, step()
case "${1:-}" in
  holds)
    TAIL=70 step holds 420 python3 -u benchmarks/table_holds.py --budget-s "${2:-360}" --out-dir "$OUT/holds" ;;
  tests)
    # Every kernel the tests launch, built once in one process (under -n 8 each xdist worker would build them all).
    TAIL=4 step prebuild 200 python3 -c "
import os, sys; sys.path.insert(0, 'tests')
import space, test_decode_gpu as d, test_seqused_gpu as s
from autotune.build.builder import Builder
arch = space.get_arch('sm_90')
items = list(dict.fromkeys([(c, p) for p, c in d.PLAN] + s.build_items(arch)))
res = Builder(arch, cache_dir=os.environ['AUTOTUNE_TEST_CACHE_DIR'], jobs=os.cpu_count()).build(items)
print(len(res), 'builds,', sum(not r.ok or r.spilled for r in res), 'failed or spilled')"
    TAIL=8 step seqused_tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_seqused_gpu.py --maxfail=30
    TAIL=8 step runtime_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_runtime_gpu.py \
      tests/test_models_gpu.py --maxfail=30
    TAIL=6 step decode_tests 110 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_decode_gpu.py \
      --maxfail=30 ;;
  models)  # capture -> campaign -> run (docs/benchmarks.md, "Whole models"), in one lease
    TAIL=20 step models_shipped 160 python3 -u benchmarks/models_e2e.py --markdown --models ${MODELS:-llama vit} \
      --capture "$OUT/models-e2e.toml"
    TAIL=20 step models_campaign 170 python3 -m autotune.cli campaign "$OUT/models-e2e.toml" --budget-s "${2:-140}" \
      --trials 24 --warm-from studies/tuned/h200.json --warm-from studies/tuned/h200-decode.json \
      --storage "sqlite:///$OUT/models.db" --markdown "$OUT/models-campaign.md"
    AUTOTUNE_STORAGE="sqlite:///$OUT/models.db" TAIL=20 step models_tuned 200 python3 -u benchmarks/models_e2e.py \
      --markdown --models ${MODELS:-llama vit} ;;
  host)
    TAIL=20 step host 60 python3 benchmarks/host_overhead.py --out "$OUT/host" ;;
  *) echo "usage: $0 holds [BUDGET_S]|tests|models [BUDGET_S]|host" >&2; exit 2 ;;
esac
