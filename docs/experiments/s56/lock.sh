#!/bin/bash
# s56: do a block's head CTAs, held together, stream a shuffled table as
# fast as an in-order one? The layout probe's nhd-hf, nhd-cl, nhd-lock4 and
# nhd-lock1 against nhd-shuf, nhd-order and dense (8B shapes; the 70B shapes
# run the three references only). Run from the repository root on the GPU
# machine: bash docs/experiments/s56/lock.sh. Results: $OUT/lock/.
set -u
R=${OUT:-/tmp}/lock; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt; cat $R/gpu.txt
nvcc -O3 -std=c++17 -arch=sm_90 -o $R/layout kernels/cuda/probe/layout_probe.cu > $R/build.txt 2>&1 || { cat $R/build.txt; exit 1; }
# nhd-shuf, nhd-order, dense, nhd-hf, nhd-cl, nhd-lock4, nhd-lock1
timeout 400 $R/layout 3 0xF00000B > $R/layout.txt 2>&1; echo "layout rc=$?"
cat $R/layout.txt
