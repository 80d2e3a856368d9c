#!/bin/bash
# s40 call 5: is main's 0.1-0.2 us per call over 85c7b88 (call 1, pointer
# null) the kernels or where the bench's buffers land? The kernels' split
# path differs by a few instructions at CTA exit (SASS compared), so:
#   old    85c7b88 (no LSE anywhere)
#   new    main (DeviceBatch allocates an LSE buffer, unused without --lse)
#   noalloc main with DeviceBatch allocating none (the kernels are main's)
#   log2   main + da_log2 (lg2.approx) in the LSE epilogues, run with --lse
#   lse    main with --lse (log2f)
# `bench --grid small`, alternated three times. Copy this file and the
# binaries (decode-attn-85c7b88, -noalloc, -log2) into .gpu; carry .gpu; run
# as `bash .gpu/call5.sh`. Results: $OUT/c5.tgz.
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; R=$OUT/c5; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/c5.tgz -C $OUT c5; }
for round in 1 2 3; do
  for v in old new noalloc log2 lse; do
    case $v in
      old) cmd=".gpu/bin/decode-attn-85c7b88 bench";; new) cmd=".gpu/bin/decode-attn bench";;
      noalloc) cmd=".gpu/bin/decode-attn-noalloc bench";; log2) cmd=".gpu/bin/decode-attn-log2 bench --lse";;
      lse) cmd=".gpu/bin/decode-attn bench --lse";;
    esac
    timeout 60 $cmd --backend cuda --csv $R/$v-r$round.csv > $R/$v-r$round.txt 2>&1; step "$v r$round" $?
  done
done
grep lse_err $R/log2-r1.txt
python3 - $R <<'PY'
import csv, glob, sys, statistics as st
rows = {}; vs = ["old", "new", "noalloc", "log2", "lse"]
for f in sorted(glob.glob(sys.argv[1] + "/*-r*.csv")):
    b = f.split("/")[-1].split("-r")[0]
    for r in csv.DictReader(open(f)):
        rows.setdefault((r["model"], int(r["B"]), int(r["s"])), {}).setdefault(b, []).append(float(r["us"]))
print("model B s", *vs, "(median us)  new/old noalloc/old lse/new log2/new")
for k in sorted(rows):
    m = {v: st.median(rows[k].get(v, [float("nan")])) for v in vs}
    print(*k, *(f"{m[v]:.2f}" for v in vs), f"{m['new']/m['old']:.3f} {m['noalloc']/m['old']:.3f} {m['lse']/m['new']:.3f} {m['log2']/m['new']:.3f}")
PY
