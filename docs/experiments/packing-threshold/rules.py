#!/usr/bin/env python3
"""Scores packing rules on run.sh's results: for each rule (pack or not,
from a batch's sequences and its plain grid's empty CTAs per active pair),
the geometric mean and the worst of `auto`'s time over the plain grid's,
taking always's time where the rule packs and off's where it does not.
Usage: rules.py DIR... (each an unpacked pt-MODEL-kKS; the model is read
from the logs)."""
import math
import re
import sys


def runs(path):
    """label -> dict(us, B, r, model), from one bench log."""
    out, label = {}, None
    for line in open(path):
        m = re.match(r"# (\S+) ragged batch (\S+):", line)
        if m:
            model, label = m.group(1), m.group(2)
            continue
        m = re.match(r"#   \S+: \d+ of the (\d+) x \d+ \(sequence, split\) pairs active; ([\d.]+) empty", line)
        if m and label in out:
            out[label].update(B=int(m.group(1)), r=float(m.group(2)))
            continue
        fields = line.split()
        if label and len(fields) >= 11 and fields[3] in ("cuda", "hip"):
            out[label] = dict(us=float(fields[6]), model=model)
    return out


points = []
for d in sys.argv[1:]:
    off, always = runs(f"{d}/off.txt"), runs(f"{d}/always.txt")
    for label, row in off.items():
        if label in always and "r" in row:
            points.append(dict(row, label=label, ratio=always[label]["us"] / row["us"]))

RULES = {
    "off": lambda p: False,
    "always": lambda p: True,
    ">= 16": lambda p: p["r"] >= 16,
    ">= 8": lambda p: p["r"] >= 8,
    ">= 4": lambda p: p["r"] >= 4,
    ">= 8, or >= 2 from 64 sequences": lambda p: p["r"] >= (2 if p["B"] >= 64 else 8),
    ">= 8, or >= 1 from 64 sequences": lambda p: p["r"] >= (1 if p["B"] >= 64 else 8),
}


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


models = sorted({p["model"] for p in points})
print(f"{len(points)} batches; per rule: geometric mean of auto/off (worst batch), all, then by model")
for name, packs in RULES.items():
    cells = []
    for subset in [points] + [[p for p in points if p["model"] == m] for m in models]:
        ratios = [p["ratio"] if packs(p) else 1.0 for p in subset]
        cells.append(f"{geomean(ratios):.3f} ({max(ratios):.3f})")
    print(f"{name:34} all {cells[0]}  " + "  ".join(f"{m} {c}" for m, c in zip(models, cells[1:])))
