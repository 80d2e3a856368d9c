#!/bin/bash
# s12 call 2: one split per warp (version 21 candidate). Conformance, GPU tests,
# A/B of DECODE_ATTN_CUDA_WARP_SPLITS=off|auto on the peers' grid, timeline.
cd "$(dirname "$0")"
R=$OUT/s12-call2; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $R/gpu.txt
B=./bin/decode-attn
$B check > $R/check.log 2>&1; echo "check rc=$?" >> $R/check.log
T=$(ls tests/gpu-* | head -1)
$T --test-threads=1 --skip nvrtc_kernels_match_the_reference > $R/gpu-tests.log 2>&1; echo "tests rc=$?" >> $R/gpu-tests.log
SH="1,8,4,1024,16;1,8,4,1024,64,4;1,1,8,1024,16;1,1,8,1024,64,4;4,1,8,1024,16;4,1,8,1024,64,4;1,8,4,16384,16;1,8,4,16384,64,4"
TIMELINE_SHAPES="$SH" ./bin/timeline > $R/timeline.txt 2>&1
for w in off auto; do
  DECODE_ATTN_CUDA_WARP_SPLITS=$w $B bench --grid peers --csv $R/grid-$w.csv > $R/grid-$w.txt 2>&1
done
for r in 2 3; do for w in off auto; do
  DECODE_ATTN_CUDA_WARP_SPLITS=$w $B bench --batch 1,4,16 --seq-len 1024,4096 --csv $R/small-$w-r$r.csv > $R/small-$w-r$r.txt 2>&1
done; done
for w in off auto; do
  DECODE_ATTN_CUDA_WARP_SPLITS=$w $B bench --batch 1,4 --seq-len 1024,4096 --cold --csv $R/cold-$w.csv > $R/cold-$w.txt 2>&1
done
cd $OUT && tar czf s12-call2.tgz s12-call2 && rm -rf s12-call2
