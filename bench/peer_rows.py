"""One result row of a peer timing, as peers_cold.py and peers_ragged.py
print and write it: bench_peers.py's CSV columns, so compare.py joins the
file to our bench's CSV. Pure Python; needs no torch."""
import csv

FIELDS = ["model", "B", "s", "peer", "mode", "us", "tbs", "pct_copy", "relerr"]


def add_row(rows, model, B, s, peer, mode, us, bytes_moved, copy_bw, err, mode_width):
    """Appends the row of one timed call to `rows` and prints it as a table
    line (`mode` padded to `mode_width`). `bytes_moved`: KV, Q and output
    bytes, as the peers count them; `copy_bw` in bytes per second."""
    tbs = bytes_moved / (us * 1e-6) / 1e12
    row = dict(model=model, B=B, s=s, peer=peer, mode=mode, us=round(us, 2), tbs=round(tbs, 3),
               pct_copy=round(100 * tbs * 1e12 / copy_bw, 1), relerr=f"{err:.1e}")
    rows.append(row)
    print(f"{model:16} {B:>4} {s:>6} {peer:14} {mode:{mode_width}} {us:9.2f} {tbs:6.2f} "
          f"{row['pct_copy']:6.1f} {err:8.1e}", flush=True)


def write_rows(path, rows):
    """Writes `rows` as CSV (rewritten whole each time, so a timeout keeps what ran)."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
