#!/bin/bash
# s47 call 6, on the H200 of calls 1-5: what was last timed on an H200 in
# s19 (version 25): batch 256 beside the peers (both models, s 1024 and
# 4096), s19's ragged batches (ours only: bench_peers.py takes uniform
# batches) and the small grid cold. Capped at 330 s. Carry .gpu holding
# this file; run `bash .gpu/call6.sh`. Results: $OUT/c6.tgz.
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/out}; R=$OUT/c6; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt; cat $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/c6.tgz -C $OUT c6; }
timeout 60 bin/decode-attn bench --backend cuda --batch 256 --seq-len 1024,4096 --csv $R/ours256.csv > $R/ours256.txt 2>&1; step ours256 $?
RAGGED=32768x1+512x63,65536x1+1024x15,spread:64:128-8192,spread:16:256-32768,spread:256:64-4096,16384x4+256x60
timeout 90 bin/decode-attn bench --backend cuda --lens $RAGGED --csv $R/ragged.csv > $R/ragged.txt 2>&1; step ragged $?
SHAPES=llama3-8b:256:1024,llama3-8b:256:4096,llama3-70b-tp8:256:1024,llama3-70b-tp8:256:4096
timeout $(( 250 - $(date +%s) + t0 )) python3 peers/bench_peers.py --shapes $SHAPES --out $R/peers256.csv > $R/peers256.log 2>&1; step peers256 $?
grep -v ',torch-sdpa,' $R/peers256.csv > $R/peers256-paged.csv
python3 peers/compare.py $R/ours256.csv $R/peers256-paged.csv > $R/compare256-paged.txt 2>&1
python3 peers/compare.py $R/ours256.csv $R/peers256.csv > $R/compare256.txt 2>&1; step compare $?
cat $R/compare256-paged.txt $R/compare256.txt
left=$(( 325 - $(date +%s) + t0 ))
[ $left -gt 20 ] && { timeout $left bin/decode-attn bench --backend cuda --cold --csv $R/cold.csv > $R/cold.txt 2>&1; step cold $?; }
