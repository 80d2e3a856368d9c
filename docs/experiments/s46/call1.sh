#!/bin/bash
# s46 call 1, on any GPU: s45's call 3 (the kv-head-grid kernel's NVRTC parts:
# conformance with a fresh cache, first-use bench against the build before,
# the gpu tests; capped at 220 s), then on an H200 only, the issue's table
# beside the peers (s36's table-h200.sh). Carry .gpu holding call3.sh,
# table-h200.sh, old/ and this file; run `bash .gpu/call1.sh`.
# Results: $OUT/c3.tgz, and $OUT/t.tgz on an H200.
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
bash call3.sh
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  TABLE_BUDGET=340 bash table-h200.sh
fi
