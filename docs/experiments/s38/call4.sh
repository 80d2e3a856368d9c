#!/bin/bash
# s38 call 4: does an L2 prefetch of tiles beyond the copies help?
# 1. kernels/cuda/probe/timeline.cu built with DA_L2_PREFETCH_STEPS = 0
#    (main's kernel), 2 and 4 (the experiment in l2-prefetch.patch, applied
#    to decode_mma.cuh first), compiled on the
#    build machine (`nvcc -O3 -std=c++17 -arch=sm_90a -I kernels/cuda
#    -DDA_L2_PREFETCH_STEPS=N -c kernels/cuda/probe/timeline.cu`, carried as
#    .gpu/obj/tlN.o) and linked here; `auto`'s plans of seven shapes, the
#    three builds alternated twice. Results: $OUT/r4.tgz.
# 2. (after 1, in the time left) layout_probe.cu, mask 0x1CB (nhd-shuf, nhd-order, dense, nhd-pf2,
#    nhd-pf4, nhd-local), two rounds: the copy pipeline alone.
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; R=$OUT/r4; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s); CAP=${CAP:-280}  # seconds this script may take
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/r4.tgz -C $OUT r4; }
for d in 0 2 4; do nvcc -arch=sm_90a -o /tmp/tl$d .gpu/obj/tl$d.o >> $R/build.log 2>&1 || exit 1; done
nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/layout kernels/cuda/probe/layout_probe.cu >> $R/build.log 2>&1; step build $?
export TIMELINE_SHAPES="16,8,4,16384,2;4,8,4,65536,8;16,1,8,65536,16;64,1,8,16384,4;16,8,4,4096,1;1,8,4,16384,64,4;1,1,8,65536,128"
for round in 1 2; do for d in 0 2 4; do
  [ $(( $(date +%s) - t0 )) -gt $(( CAP - 80 )) ] && break 2
  timeout 120 /tmp/tl$d > $R/tl$d-r$round.txt 2>&1; step "timeline D=$d round $round" $?
  grep -E 'us per call \(' $R/tl$d-r$round.txt | sed "s/^/D=$d r$round /" | tee -a $R/summary.txt
done; done
left=$(( CAP - $(date +%s) + t0 ))
[ $left -gt 30 ] && { timeout $left /tmp/layout 2 0x1CB > $R/layout-pf.txt 2>&1; step layout $?; cat $R/layout-pf.txt; }
