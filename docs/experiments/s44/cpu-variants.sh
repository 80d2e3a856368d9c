#!/bin/bash
# s44: CPU builds alternated round by round, `bench --backend cpu`, bf16,
# B 1 and 4, s 16384 and 65536; prints each cell's % of copy per build.
# Usage: cpu-variants.sh OUTDIR ROUNDS MODELS NAME... (each NAME a
# decode-attn binary in $BINS, default /tmp/s44/bins; s44 built them from
# worktrees of main with one constant or function changed).
R=$1; ROUNDS=$2; MODEL=$3; shift 3; mkdir -p $R
args="bench --backend cpu --model $MODEL --batch 1,4 --seq-len 16384,65536"
for round in $(seq 1 $ROUNDS); do for v in "$@"; do
  ${BINS:-/tmp/s44/bins}/$v $args --csv $R/$v-r$round.csv > $R/$v-r$round.txt 2>&1
done; done
python3 - $R "$@" <<'PY'
import csv, glob, sys, statistics as st
R = sys.argv[1]; names = sys.argv[2:]; rows = {}
for f in sorted(glob.glob(R + "/*-r*.csv")):
    v = f.split("/")[-1].split("-r")[0]
    for r in csv.DictReader(open(f)):
        rows.setdefault((r["model"], int(r["B"]), int(r["s"])), {}).setdefault(v, []).append(float(r["pct_copy"]))
print(f"{'model':16} {'B':>2} {'s':>6}  " + "  ".join(f"{n:>18}" for n in names))
for k in sorted(rows):
    print(f"{k[0]:16} {k[1]:2} {k[2]:6}  " + "  ".join(f"{' '.join(f'{x:5.1f}' for x in rows[k].get(n, [])):>18}" for n in names))
PY
