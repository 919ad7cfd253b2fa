#!/usr/bin/env bash
# Per-instruction stall sampling of our kernel (the config autotune.attention picks) on one or more shapes:
# Nsight Compute's SourceCounters/WarpStateStats sections, clocks left as found, then the SASS source page as CSV
# (each instruction with its warp-state samples), so a hot loop's stalls can be read line by line.
#   benchmarks/ncu_source.sh OUT_DIR SHAPE_KEY...
#   NCU_CONFIG=KEY NCU_LABEL=NAME benchmarks/ncu_source.sh OUT_DIR SHAPE_KEY...   that config alone instead (through
#                                  the loader), its files named SHAPE_KEY-NAME
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: $0 OUT_DIR SHAPE_KEY...}; shift
mkdir -p "$out"
pick=(); label=""
if [ -n "${NCU_CONFIG:-}" ]; then pick=(--config "$NCU_CONFIG" --configs-only); label=-${NCU_LABEL:?NCU_LABEL names the files of NCU_CONFIG}; fi
for key in "$@"; do
  shape=$key$label
  ncu --clock-control none --profile-from-start off --section SourceCounters --section WarpStateStats \
      --section LaunchStats -f -o "$out/$shape" \
      python3 benchmarks/ncu_compare.py profile --shape "$key" --ours-only "${pick[@]}" >"$out/$shape-ncu.log" 2>&1 \
    || { tail -20 "$out/$shape-ncu.log"; continue; }
  ncu -i "$out/$shape.ncu-rep" --page source --csv --print-source sass >"$out/$shape-sass.csv" 2>"$out/$shape-page.err" \
    || ncu -i "$out/$shape.ncu-rep" --page source --csv >"$out/$shape-sass.csv" 2>>"$out/$shape-page.err"
  ncu -i "$out/$shape.ncu-rep" --page details --csv >"$out/$shape-details.csv" 2>>"$out/$shape-page.err"
  echo "$shape: $(wc -l <"$out/$shape-sass.csv") source rows"
done
