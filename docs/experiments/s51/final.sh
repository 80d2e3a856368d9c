#!/bin/bash
# s51 final: GPU conformance of the session's last build (core's new size
# checks run on every CUDA decode; decode.cu changed in comments only):
# the gpu and caller test binaries and `check --backend cuda`; then, on an
# H200 only, the issue's table beside the peers (s50's call 2). Copy this
# file, ../s50/call2.sh and ../lib.sh into .gpu, carry .gpu, run
# `bash .gpu/final.sh`. Results: $OUT/c5.tgz (and $OUT/c2.tgz on an H200).
cd "$(dirname "$0")"
. ./lib.sh c5 300
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt; cat $R/gpu.txt
for T in tests/gpu-* tests/caller-*; do
  n=$(basename $T | cut -d- -f1)
  timeout $(cap 120) $T --test-threads=1 > $R/test-$n.txt 2>&1; step test-$n $?
  grep -E "FAILED|panicked|test result" $R/test-$n.txt | head
done
timeout $(cap 90) bin/decode-attn check --backend cuda > $R/check.txt 2>&1; step check $?
tail -2 $R/check.txt
case "$(gpu_name)" in *H200*) bash ./call2.sh ;; *) echo "not an H200: no table" ;; esac
