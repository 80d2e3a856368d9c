#!/bin/bash
# s40 call 1: main's kernels on a GPU for the first time since the LSE
# (0fa9072). 1. every staged test binary but `binary` (it runs cargo, which
# the GPU machine lacks); 2. the conformance sweep, the default kernels and
# the kv-head-grid one (LSE checked on every case); 3. the LSE's cost:
# `bench --grid small` (B 1/16, s 1024/4096, both models: the calls where an
# epilogue weighs most) with 85c7b88's binary (before the LSE), main's, and
# main's with `--lse` (the LSE written), alternated three times.
# Stage main (`gpu-stage --peers --bin decode-attn`), copy this file and the
# old binary (.gpu/bin/decode-attn-85c7b88) into .gpu; carry .gpu; run as
# `bash .gpu/call1.sh`. Results: $OUT/c1.tgz, saved after each step.
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; R=$OUT/c1; mkdir -p $R/tests
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/c1.tgz -C $OUT c1; }
for t in .gpu/tests/*; do
  name=$(basename $t); [[ $name == binary-* ]] && continue
  timeout 150 $t --test-threads=1 > $R/tests/$name.log 2>&1; step "test $name" $?
  grep -E "^test result|FAILED|panicked" $R/tests/$name.log | head -8
done
timeout 60 .gpu/bin/decode-attn check --backend cuda > $R/check.log 2>&1; step check $?; tail -2 $R/check.log
DECODE_ATTN_CUDA_KERNEL=kvgrid timeout 90 .gpu/bin/decode-attn check --backend cuda > $R/check-kvgrid.log 2>&1; step check-kvgrid $?; tail -2 $R/check-kvgrid.log
for round in 1 2 3; do
  timeout 60 .gpu/bin/decode-attn-85c7b88 bench --backend cuda --csv $R/old-r$round.csv > $R/old-r$round.txt 2>&1; step "old r$round" $?
  timeout 60 .gpu/bin/decode-attn bench --backend cuda --csv $R/new-r$round.csv > $R/new-r$round.txt 2>&1; step "new r$round" $?
  timeout 60 .gpu/bin/decode-attn bench --backend cuda --lse --csv $R/lse-r$round.csv > $R/lse-r$round.txt 2>&1; step "lse r$round" $?
done
cat $R/new-r1.txt $R/lse-r1.txt
