#!/bin/bash
# s41 call 3: the LSE's cost on small calls (s40: main 0.04-0.17 us over
# 85c7b88, the last build before the LSE). Two builds that keep the LSE:
#   v1  store_cta_state writes a lone split's LSE in its first step, where
#       the thread of a head already holds M and L, instead of in a second
#       block after the rows that computed M and L again
#   v2  v1, and the stream reducer computes the row's LSE before its
#       barrier and stores it after the output row (not before the barrier)
# `check --backend cuda` on each, then `bench --grid small` alternated six
# times: 85c7b88 (old), main, v1, v2 with the LSE pointer null, and main,
# v1, v2 with `--lse`. On an H200, s36's table-h200.sh instead (the
# targets' table, last run in s26). Copy this file, ../s36/table-h200.sh,
# and the binaries (decode-attn-85c7b88, -v1, -v2) into .gpu/bin; carry
# .gpu; run as `bash .gpu/call3.sh`. Results: $OUT/c3.tgz.
cd "$(dirname "$0")"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash table-h200.sh; fi
cd ..
OUT=${OUT:-/tmp/out}; R=$OUT/c3; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt; cat $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" >> $R/progress.txt; tar czf $OUT/c3.tgz -C $OUT c3; }
for v in v1 v2; do
  timeout 60 .gpu/bin/decode-attn-$v check --backend cuda > $R/check-$v.log 2>&1; step "check $v" $?; tail -1 $R/check-$v.log
done
bin() { case $1 in old) echo .gpu/bin/decode-attn-85c7b88;; main) echo .gpu/bin/decode-attn;; *) echo .gpu/bin/decode-attn-$1;; esac; }
for round in 1 2 3 4 5 6; do
  for v in old main v1 v2; do
    timeout 40 $(bin $v) bench --backend cuda --csv $R/$v-r$round.csv > $R/$v-r$round.txt 2>&1; step "$v r$round" $?
  done
  for v in main v1 v2; do
    timeout 40 $(bin $v) bench --backend cuda --lse --csv $R/$v+lse-r$round.csv > $R/$v+lse-r$round.txt 2>&1; step "$v+lse r$round" $?
  done
done
vs="old main v1 v2 main+lse v1+lse v2+lse"
python3 - $R $vs <<'PY'
import csv, glob, sys, statistics as st
rows = {}; vs = sys.argv[2:]
for f in sorted(glob.glob(sys.argv[1] + "/*-r*.csv")):
    b = f.split("/")[-1].rsplit("-r", 1)[0]
    for r in csv.DictReader(open(f)):
        rows.setdefault((r["model"], int(r["B"]), int(r["s"])), {}).setdefault(b, []).append(float(r["us"]))
print("model B s", *vs, "(median us of 6)")
for k in sorted(rows):
    m = {v: st.median(rows[k].get(v, [float("nan")])) for v in vs}
    print(*k, *(f"{m[v]:.2f}" for v in vs))
PY
grep -h lse_err $R/v2+lse-r1.txt | head -2
