#!/bin/bash
# s48 call 2 (after call 1, on the same machine): the timeline of the two
# 70B at TP=8 shapes short of 1.5x SDPA that are reachable in principle (B=1
# s=65536, 128 splits; B=4 s=16384, 32 splits a sequence), on main's kernels
# built with DA_TIMELINE (kernels/cuda/probe/timeline.cu), shuffled and in
# order. Copy this file and ../lib.sh into .gpu, carry .gpu, run
# `bash .gpu/call2.sh`. Results: $OUT/c2.tgz.
cd "$(dirname "$0")"
. ./lib.sh c2 300
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt; cat $R/gpu.txt
nvcc -O3 -std=c++17 -arch=sm_90a -I ../kernels/cuda -o $R/timeline ../kernels/cuda/probe/timeline.cu > $R/build.txt 2>&1; step build $?
export TIMELINE_SHAPES="1,1,8,65536,128;4,1,8,16384,32"
timeout $(cap 90) $R/timeline > $R/timeline.txt 2>&1; step timeline $?
TIMELINE_ORDERED=1 timeout $(cap 90) $R/timeline > $R/timeline-ordered.txt 2>&1; step timeline-ordered $?
rm -f $R/timeline
cat $R/timeline.txt; grep -E "per call|landed|stored|wait" $R/timeline-ordered.txt
