#!/bin/bash
# s50 call 2: the issue's table, ours then the peers in the same call,
# compare.py with and without SDPA (s36's table-h200.sh). Copy this file
# and ../lib.sh into .gpu, carry .gpu (gpu-stage --peers --bin
# decode-attn), run `bash .gpu/call2.sh`. Results: $OUT/c2.tgz.
cd "$(dirname "$0")"
. ./lib.sh c2 585
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt; cat $R/gpu.txt
B=bin/decode-attn
timeout $(cap 200) $B bench --backend cuda --grid peers --csv $R/ours.csv > $R/ours.txt 2>&1; step ours $?
timeout $(cap 380) python3 peers/bench_peers.py --out $R/peers.csv > $R/peers.log 2>&1; step peers $?
grep -v ',torch-sdpa,' $R/peers.csv > $R/peers-paged.csv
python3 peers/compare.py $R/ours.csv $R/peers-paged.csv > $R/compare-paged.txt 2>&1
python3 peers/compare.py $R/ours.csv $R/peers.csv > $R/compare.txt 2>&1; step compare $?
cat $R/compare.txt
