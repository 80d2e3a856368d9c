#!/bin/bash
# s47 call 7, for an H200 (it ran on an H100: the H200 was not to be had):
# (a) the small grid replayed from a plan for 65536 tokens (last
# measured in s26 call 2, before the LSE); (b) the issue's grid at B <= 4
# writing the LSE (`--lse`) and without, alternated; (c) the two 70B shapes
# short of 1.5x SDPA that are reachable in principle, at auto's 128 CTAs
# against 132 (one per multiprocessor) and more. Capped at 200 s. Copy this
# file and ../lib.sh into .gpu, carry .gpu, run `bash .gpu/call7.sh`.
# Results: $OUT/c7.tgz.
cd "$(dirname "$0")"
. ./lib.sh c7 200
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt; cat $R/gpu.txt
B=bin/decode-attn
timeout $(cap 40) $B bench --backend cuda --plan-seq-len 65536 > $R/replay65536.txt 2>&1; step replay65536 $?
for run in 1 2; do
  timeout $(cap 40) $B bench --backend cuda --batch 1,4 --seq-len 1024,4096,16384,65536 > $R/nolse-$run.txt 2>&1; step nolse-$run $?
  timeout $(cap 40) $B bench --backend cuda --batch 1,4 --seq-len 1024,4096,16384,65536 --lse > $R/lse-$run.txt 2>&1; step lse-$run $?
done
timeout $(cap 30) $B bench --backend cuda --model llama3-70b-tp8 --batch 1 --seq-len 65536 --policy auto,fixed:132,fixed:256 > $R/splits-b1.txt 2>&1; step splits-b1 $?
timeout $(cap 30) $B bench --backend cuda --model llama3-70b-tp8 --batch 4 --seq-len 16384 --policy auto,fixed:33,fixed:64 > $R/splits-b4.txt 2>&1; step splits-b4 $?
grep -hv "^#   " $R/*.txt | grep -E "^llama|^model" | sort -u | head -80
