#!/bin/bash
# s32: (1) the CPU kernel's production build per tile with its KV in L1 .. L3
# (`tile_footprint`); (2) s30's C models of the two 70B loops beside the same
# loops with pairs summed apart (loops_pairs.c: S3, V4); (3) the same models
# with their operands 16 bytes off a 64-byte boundary (loops_misaligned.c).
# Run on an idle machine, from the repository root.
set -e
D=docs/measurements/2026-12-05-s32-cpu-tile
cargo build -q --release -p decode-attn --example tile_footprint
for i in 1 2 3; do taskset -c 1 target/release/examples/tile_footprint; done
gcc -O3 -funroll-loops -mavx2 -mfma -o /tmp/s32-loops-pairs $D/loops_pairs.c
taskset -c 1 /tmp/s32-loops-pairs
for offsets in "0 0 0 0" "16 0 0 0" "0 16 0 0" "16 16 0 0" "32 32 0 0" "16 0 16 16"; do
  set -- $offsets
  gcc -O3 -funroll-loops -mavx2 -mfma -DKOFF=$1 -DQOFF=$2 -DAOFF=$3 -DPOFF=$4 -o /tmp/s32-loops-mis $D/loops_misaligned.c
  echo "K rows +$1 B, queries +$2 B, accumulators +$3 B, weights +$4 B:"
  taskset -c 1 /tmp/s32-loops-mis | grep -E "peak|S0|V0"
done
