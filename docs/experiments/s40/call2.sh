#!/bin/bash
# s40 call 2: the issue's grid beside the peers in one call, on the GPU that
# comes. H200 (the targets' GPU): s36's table-h200.sh, every shape, not rerun
# since s26. H100: s37's h100-grid.sh (B 1, 4, 16; the whole grid does not
# fit one call's 600 s there with the peers). Copy this file,
# ../s36/table-h200.sh and ../s37/h100-grid.sh into
# .gpu; carry .gpu; run as `bash .gpu/call2.sh`. Results: $OUT/t.tgz or
# $OUT/grid.tgz.
cd "$(dirname "$0")"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash table-h200.sh; fi
exec bash h100-grid.sh
