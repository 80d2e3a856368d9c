"""A/B of our own benchmark runs: joins CSVs written by `decode-attn bench
--csv` on (model, B, s, mode) and prints, per shape, A's and B's
microseconds and B's change against A in percent. Pairs of files are
columns side by side, so one table can hold a change in both orders (A
then B in one run, B then A in the next) or a binary against itself, which
is the noise to read the change against. Pure Python; needs no torch.

    python3 bench/ab.py BASE.csv NEW.csv [BASE2.csv NEW2.csv ...]

Rows of other tools (a `peer` column other than decode-attn) are ignored,
so a CSV that also holds the peers' rows works too. A shape missing from
either file of a pair leaves that pair's cells empty; the last line says
each pair's range of changes and how many shapes got slower.
"""
import csv
import sys

OURS = "decode-attn"
ORDER = ["llama3-8b", "llama3-70b-tp8"]


def load(path):
    """{(model, B, s, mode): microseconds} of our rows in one CSV."""
    with open(path, newline="") as f:
        return {
            (r["model"], int(r["B"]), int(r["s"]), r["mode"]): float(r["us"])
            for r in csv.DictReader(f)
            if r.get("peer", OURS) == OURS
        }


def shape_key(key):
    model, batch, seq_len, mode = key
    rank = ORDER.index(model) if model in ORDER else len(ORDER)
    return (rank, model, batch, seq_len, mode)


def main(argv):
    if len(argv) < 2 or len(argv) % 2:
        sys.exit(__doc__.split("\n\n")[1])
    pairs = [(load(a), load(b)) for a, b in zip(argv[0::2], argv[1::2])]
    keys = sorted(set().union(*(set(a) | set(b) for a, b in pairs)), key=shape_key)
    modes = {k[3] for k in keys}
    head = f"{'model':16}{'B':>5}{'s':>7}" + ("  mode" + " " * 18 if len(modes) > 1 else "")
    print(head + "".join(f"  {'A us':>9}{'B us':>9}{'change':>8}" for _ in pairs))
    changes = [[] for _ in pairs]
    for key in keys:
        model, batch, seq_len, mode = key
        line = f"{model:16}{batch:>5}{seq_len:>7}" + (f"  {mode:22}" if len(modes) > 1 else "")
        for i, (a, b) in enumerate(pairs):
            if key in a and key in b:
                change = 100.0 * (b[key] / a[key] - 1.0)
                changes[i].append(change)
                line += f"  {a[key]:9.2f}{b[key]:9.2f}{change:+7.2f}%"
            else:
                line += " " * 28
        print(line)
    for i, c in enumerate(changes):
        if c:
            slower = sum(x > 0 for x in c)
            print(f"pair {i + 1}: {len(c)} shapes, {min(c):+.2f}% to {max(c):+.2f}%, {slower} slower")


if __name__ == "__main__":
    main(sys.argv[1:])
