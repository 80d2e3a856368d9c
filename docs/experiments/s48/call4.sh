#!/bin/bash
# s48 call 4: the `_sorted` entry points (DECODE_ATTN_CUDA_TILE_ORDER=address:
# each split's whole tiles visited in the order of their blocks' addresses,
# sorted in shared memory by the CTA) on a GPU: the GPU test written for
# them, the conformance sweep with them, then an A/B against the table's
# order in one call (alternated, two rounds on the shapes of 4096 and 16384
# tokens at B 4-64, one on 65536 at B 1-16). Copy this file and ../lib.sh
# into .gpu, carry .gpu, run `bash .gpu/call4.sh`. Results: $OUT/c4.tgz.
cd "$(dirname "$0")"
. ./lib.sh c4 330
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt; cat $R/gpu.txt
B=bin/decode-attn
T=$(ls tests/gpu-* | head -1)
timeout $(cap 100) $T --test-threads=1 tiles_in_address_order > $R/gpu-test.txt 2>&1; step gpu-test $?
tail -4 $R/gpu-test.txt
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
