#!/bin/bash
# s45 call 2: on an H200, the issue's table (s36's table-h200.sh, in .gpu);
# on anything else, only the GPU's name (the H100 numbers of this session
# are in call 1's and the first table's files). Carry .gpu, run `bash
# .gpu/call2.sh`. Results: $OUT/t.tgz on an H200.
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash table-h200.sh; fi
