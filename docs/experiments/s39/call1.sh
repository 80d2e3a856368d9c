#!/bin/bash
# s39 call 1 (not run: no machine came): the conformance sweep on the
# staged binary's kernels, then s38's call4.sh (the L2 prefetch A/B and the
# layout probe's new modes). Stage main first (`gpu-stage --peers --bin
# decode-attn`, s38's timeline objects in .gpu/obj) so that the sweep checks
# the LSE output (0fa9072) on the GPU; copy this file into .gpu; run as
# `CAP=... bash .gpu/call1.sh`.
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p $OUT/r4
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/r4/gpu0.txt
timeout 40 .gpu/bin/decode-attn check --backend cuda > $OUT/r4/check.log 2>&1; echo "check rc=$?" >> $OUT/r4/progress.txt
tail -1 $OUT/r4/check.log
DECODE_ATTN_CUDA_KERNEL=kvgrid timeout 60 .gpu/bin/decode-attn check --backend cuda > $OUT/r4/check-kvgrid.log 2>&1; echo "check-kvgrid rc=$?" >> $OUT/r4/progress.txt
tail -1 $OUT/r4/check-kvgrid.log
CAP=${CAP:-270} bash .gpu/call4.sh
