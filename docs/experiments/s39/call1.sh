#!/bin/bash
# s39 call 1: the conformance sweep on main's kernels (85c7b88's, staged),
# then s38's call4.sh (the L2 prefetch A/B and the layout probe's new
# modes). Copy into .gpu; run as `CAP=... bash .gpu/call1.sh`.
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p $OUT/r4
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/r4/gpu0.txt
timeout 40 .gpu/bin/decode-attn check --backend cuda > $OUT/r4/check.log 2>&1; echo "check rc=$?" >> $OUT/r4/progress.txt
tail -1 $OUT/r4/check.log
DECODE_ATTN_CUDA_KERNEL=kvgrid timeout 60 .gpu/bin/decode-attn check --backend cuda > $OUT/r4/check-kvgrid.log 2>&1; echo "check-kvgrid rc=$?" >> $OUT/r4/progress.txt
tail -1 $OUT/r4/check-kvgrid.log
CAP=${CAP:-270} bash .gpu/call4.sh
