#!/bin/bash
# s38: on an H200, the issue's whole grid beside the peers (s36's
# table-h200.sh: the targets' GPU, not rerun since s26). Elsewhere:
# kernels/cuda/probe/layout_probe.cu (how much of the large shapes' gap to
# dense SDPA is the KV's layout or the grid's fit), then every staged test
# binary (.gpu/run.sh; only the `gpu` binary had run on 2222c7c's planning
# floor). Copy this and ../s36/table-h200.sh into .gpu; carry .gpu; run as
# `bash .gpu/call2.sh`. Results: $OUT/r.tgz.
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash .gpu/table-h200.sh; fi
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/r.tgz -C $OUT r; }
nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/layout kernels/cuda/probe/layout_probe.cu > $R/layout-build.log 2>&1; step build $?
timeout 200 /tmp/layout 3 > $R/layout.txt 2>&1; step layout $?
cat $R/layout.txt
OUT=$R timeout $(( 580 - $(date +%s) + t0 )) bash .gpu/run.sh > $R/run.log 2>&1; step tests $?
tail -40 $R/run.log
