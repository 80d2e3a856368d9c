#!/bin/bash
# s49 call 2: call 1 found the kernel's in-shared-memory bitonic sort
# (the `_sorted` entry points) 0-14% slower than the table's order, and
# the layout probe's nhd-ksort (the same sort in the probe) 2-9% slower
# than nhd-shuf while nhd-sort (sorted on the host, free) is 0.4-2% faster.
# Here: does a coarse order, each split's entries bucketed by the range of
# the pool they fall in (16, 64 or 256 ranges, the table's order within
# one), win what the full sort wins (nhd-b16/64/256), and does it survive
# a counting sort in the kernel (nhd-kb64/256, cost in; nhd-kbs256 the
# stable one a kernel would need)? The probe checks each in-kernel order on
# the first CTA before timing ("# ... in the expected order"). Beside
# nhd-shuf and nhd-sort, 2 rounds alternated (to fit the device time left). Copy this file and ../lib.sh into
# .gpu, carry .gpu, run `bash .gpu/call2.sh`. Results: $OUT/c2.tgz.
cd "$(dirname "$0")"
. ./lib.sh c2 170
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt; cat $R/gpu.txt
nvcc -O3 -std=c++17 -arch=sm_90 -o $R/layout ../kernels/cuda/probe/layout_probe.cu > $R/layout-build.txt 2>&1; step build $?
# nhd-shuf (bit 0), nhd-sort (12), nhd-b16/64/256 (17-19), nhd-kb64/256 (20-21), nhd-kbs256 (22)
[ -x $R/layout ] && { timeout $(cap 150) $R/layout 2 0x7E1001 > $R/layout.txt 2>&1; step layout $?; rm -f $R/layout; }
cat $R/layout.txt
