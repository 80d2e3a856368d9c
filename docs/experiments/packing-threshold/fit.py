#!/usr/bin/env python3
"""Joins run.sh's `off` and `always` runs per ragged batch: the empty CTAs
per active pair of the batch's plan (bench's note under the row) against
always's time over off's. Usage: fit.py DIR (the unpacked pt-MODEL-kKS)."""
import re
import sys


def runs(path):
    """label -> (us, empty per active or None), from one bench log."""
    out, label, row = {}, None, None
    for line in open(path):
        m = re.match(r"# \S+ ragged batch (\S+):", line)
        if m:
            label = m.group(1)
            continue
        m = re.match(r"#   \S+: \d+ of the \d+ x \d+ \(sequence, split\) pairs active; ([\d.]+) empty", line)
        if m and label in out:
            out[label] = (out[label][0], float(m.group(1)))
            continue
        fields = line.split()
        if label and len(fields) >= 11 and fields[3] in ("cuda", "hip", "cpu"):
            out[label] = (float(fields[6]), None)
    return out


d = sys.argv[1]
off, always = runs(f"{d}/off.txt"), runs(f"{d}/always.txt")
try:
    again = runs(f"{d}/off-again.txt")
except FileNotFoundError:
    again = {}
rows = []
for label, (us_off, ratio) in off.items():
    if label not in always:
        continue
    us_always = always[label][0]
    drift = f"{again[label][0] / us_off:.3f}" if label in again else "-"
    rows.append((ratio if ratio is not None else -1.0, label, us_off, us_always, drift))
print(f"{'empty/active':>12} {'batch':28} {'off us':>9} {'always us':>9} {'always/off':>10} {'off again/off':>13}")
for ratio, label, us_off, us_always, drift in sorted(rows):
    shown = f"{ratio:.1f}" if ratio >= 0 else "dense"
    print(f"{shown:>12} {label:28} {us_off:9.2f} {us_always:9.2f} {us_always / us_off:10.3f} {drift:>13}")
