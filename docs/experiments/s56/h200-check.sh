#!/bin/bash
# s56, with too little device time left for the table beside the peers:
# on an H200 only, the gpu and caller tests and `check --backend cuda` on
# the xtask's fatbin (f3154c41, run on H100s only so far), then our half
# of the grid (`bench --grid peers`, no peers) in what is left. Exits at
# once on any other GPU. Copy this file and ../lib.sh into .gpu, carry
# .gpu, run `bash .gpu/h200-check.sh`. Results: $OUT/c4.tgz.
cd "$(dirname "$0")"
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $name"
case "$name" in *H200*) ;; *) echo "not an H200: nothing run"; exit 3 ;; esac
. ./lib.sh c4 200
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
for T in tests/gpu-* tests/caller-*; do
  n=$(basename $T | cut -d- -f1)
  timeout $(cap 80) $T --test-threads=1 > $R/test-$n.txt 2>&1; step test-$n $?
  grep -E "FAILED|panicked|test result" $R/test-$n.txt | head
done
timeout $(cap 30) bin/decode-attn check --backend cuda > $R/check.txt 2>&1; step check $?
tail -2 $R/check.txt
timeout $(cap 200) bin/decode-attn bench --backend cuda --grid peers --csv $R/ours.csv > $R/ours.txt 2>&1; step ours $?
tail -40 $R/ours.txt
