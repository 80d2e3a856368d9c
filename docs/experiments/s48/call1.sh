#!/bin/bash
# s48 call 1, for an H200: (a) s47 call 7's measurements, which ran on an
# H100 instead: the small grid replayed from a plan for 65536 tokens, and
# the two 70B shapes short of 1.5x SDPA at auto's CTAs against 132 and
# more (call 7's LSE A/B is left out: device time was short); (b) the
# layout probe with three new tables: each split's blocks visited in
# address order (nhd-sort), and the pool shuffled in runs of 4 and 16
# blocks (nhd-run4, nhd-run16), beside nhd-shuf, nhd-order and dense.
# Copy this file and ../lib.sh into .gpu, carry .gpu, run `bash .gpu/call1.sh`.
# Results: $OUT/c1.tgz.
cd "$(dirname "$0")"
. ./lib.sh c1 330
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt; cat $R/gpu.txt
B=bin/decode-attn
( nvcc -O3 -std=c++17 -arch=sm_90 -o $R/layout ../kernels/cuda/probe/layout_probe.cu > $R/layout-build.txt 2>&1; echo "nvcc rc=$?" >> $R/layout-build.txt ) &
build=$!
timeout $(cap 40) $B bench --backend cuda --plan-seq-len 65536 > $R/replay65536.txt 2>&1; step replay65536 $?
timeout $(cap 40) $B bench --backend cuda > $R/small-own-plan.txt 2>&1; step small-own-plan $?
timeout $(cap 30) $B bench --backend cuda --model llama3-70b-tp8 --batch 1 --seq-len 65536 --policy auto,fixed:132,fixed:256 > $R/splits-b1.txt 2>&1; step splits-b1 $?
timeout $(cap 30) $B bench --backend cuda --model llama3-70b-tp8 --batch 4 --seq-len 16384 --policy auto,fixed:33,fixed:64 > $R/splits-b4.txt 2>&1; step splits-b4 $?
wait $build; cat $R/layout-build.txt
# nhd-shuf, nhd-order, dense, nhd-sort, nhd-run4, nhd-run16
[ -x $R/layout ] && { timeout $(cap 150) $R/layout 3 0x700B > $R/layout.txt 2>&1; step layout $?; rm -f $R/layout; }
cat $R/layout.txt 2>/dev/null
grep -hv "^#   " $R/*.txt | grep -E "^llama|^model" | sort -u | head -60
