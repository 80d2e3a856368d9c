#!/bin/bash
# s49 call 1, main at 1533225: s48's call 4 (its script, never run, removed
# since: this one does all it did) with the whole GPU test binary and
# the default-order conformance sweep first (neither has run since the
# `_sorted` entry points went in). Steps: all tests of the gpu binary; `check
# --backend cuda` (table order, the default); the same with
# DECODE_ATTN_CUDA_TILE_ORDER=address; then an A/B of table vs address order
# in one call, alternated (mid1/mid2: B 4,16,64 x 4096,16384; long1: B 1,4,16
# x 65536). Copy this file and ../lib.sh into .gpu, carry .gpu, run
# `bash .gpu/call1.sh`. Results: $OUT/c1.tgz.
cd "$(dirname "$0")"
. ./lib.sh c1 570
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt; cat $R/gpu.txt
B=bin/decode-attn
T=$(ls tests/gpu-* | head -1)
timeout $(cap 150) $T --test-threads=1 > $R/test-gpu.txt 2>&1; step test-gpu $?
grep -E "FAILED|panicked|test result" $R/test-gpu.txt | head
timeout $(cap 90) $B check --backend cuda > $R/check-table.txt 2>&1; step check-table $?
tail -2 $R/check-table.txt
DECODE_ATTN_CUDA_TILE_ORDER=address timeout $(cap 90) $B check --backend cuda > $R/check-address.txt 2>&1; step check-address $?
tail -2 $R/check-address.txt
ab() { # label, bench args...
  local label=$1; shift
  for order in table address; do
    DECODE_ATTN_CUDA_TILE_ORDER=$order timeout $(cap 60) $B bench --backend cuda "$@" > $R/$label-$order.txt 2>&1; step $label-$order $?
  done
}
ab mid1 --batch 4,16,64 --seq-len 4096,16384
ab long1 --batch 1,4,16 --seq-len 65536
ab mid2 --batch 4,16,64 --seq-len 4096,16384
for f in $R/*-table.txt $R/*-address.txt; do echo "== $(basename $f)"; grep -E "^llama|copy" $f; done
