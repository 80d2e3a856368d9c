#!/bin/bash
# s48 call 3: call 1's layout probe found that visiting each split's blocks
# in address order (nhd-sort, the table sorted on the host) wins back most
# of what the shuffled table costs against an in-order one. Here: is that
# the order of a CTA's nearby tiles (nhd-wsort: sorted only within windows
# of 64 entries) or all CTAs sweeping the pool together, and does it
# survive the kernel sorting its own entries in shared memory before its
# first copy (nhd-ksort)? Beside nhd-shuf, nhd-order and nhd-sort, 3
# rounds alternated. Copy this file and ../lib.sh into .gpu, carry .gpu,
# run `bash .gpu/call3.sh`. Results: $OUT/c3.tgz.
cd "$(dirname "$0")"
. ./lib.sh c3 200
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt; cat $R/gpu.txt
nvcc -O3 -std=c++17 -arch=sm_90 -o $R/layout ../kernels/cuda/probe/layout_probe.cu > $R/layout-build.txt 2>&1; step build $?
# nhd-shuf (bit 0), nhd-order (1), nhd-sort (12), nhd-wsort (15), nhd-ksort (16)
[ -x $R/layout ] && { timeout $(cap 170) $R/layout 3 0x19003 > $R/layout.txt 2>&1; step layout $?; rm -f $R/layout; }
cat $R/layout.txt
