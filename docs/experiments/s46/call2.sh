#!/bin/bash
# s46 call 2: on an H200, the issue's table beside the peers (s36's
# table-h200.sh, in .gpu); on anything else, only the GPU's name (this
# session's H100 run is call 1's). Carry .gpu, run `bash .gpu/call2.sh`.
# Results: $OUT/t.tgz on an H200.
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash table-h200.sh; fi
