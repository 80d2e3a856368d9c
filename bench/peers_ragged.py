"""Times the peers' decode-attention kernels on ragged batches (sequences of
different lengths in one batch), the way bench_peers.py times them on uniform
ones, and writes the same CSV columns (model,B,s,peer,mode,us,tbs,pct_copy,relerr)
with B = number of sequences and s = the longest length, so that compare.py can
join it to our own bench's CSV for the same batch.

Peers: vLLM's unified_attention and SGLang's grouped decode kernel, imported
from bench_peers (never copied), each checked against a per-sequence float32
reference first. torch SDPA is skipped: it needs dense, equal-length KV.

    python3 bench/peers_ragged.py --batches llama3-8b:32768x1+512x63,llama3-8b:spread:64:128-8192

SPEC is MODEL:TERMS, TERMS either LxC+LxC+... (C sequences of length L, in that
order) or spread:B:LO-HI (B lengths evenly spaced from LO to HI, increasing).
--out FILE.csv (default $OUT/peers_ragged.csv); --peers-dir DIR (default
$PEERS_DIR, else .gpu/peers under the repository root, where gpu-stage puts
the harness). `--self-test` checks the SPEC parser; it needs no torch.
"""
import argparse, math, os, sys

from peer_rows import add_row, write_rows


def parse_spec(spec):
    """'MODEL:TERMS' -> (model, [len, ...]) with the lengths in batch order."""
    try:
        model, terms = spec.split(":", 1)
        if terms.startswith("spread:"):
            _, b, span = terms.split(":")
            b, (lo, hi) = int(b), map(int, span.split("-"))
            ok = b >= 1 and 1 <= lo <= hi
            lens = [lo] if b == 1 else [lo + (hi - lo) * i // (b - 1) for i in range(b)]
        else:
            counts = [tuple(map(int, t.split("x"))) for t in terms.split("+")]
            ok = all(l >= 1 and c >= 1 for l, c in counts)
            lens = [l for l, c in counts for _ in range(c)]
    except ValueError:  # a missing ':', 'x' or '-', or a non-integer
        ok = False
    if not (ok and model):
        raise ValueError(f"bad SPEC {spec!r}: want MODEL:LxC+LxC+... or MODEL:spread:B:LO-HI")
    return model, lens


def self_test():
    assert parse_spec("llama3-8b:32768x1+512x63") == ("llama3-8b", [32768] + [512] * 63)
    assert parse_spec("llama3-70b-tp8:100x2+7x1") == ("llama3-70b-tp8", [100, 100, 7])
    assert parse_spec("m:spread:1:128-8192") == ("m", [128])
    assert parse_spec("m:spread:5:0010-20") == ("m", [10, 12, 15, 17, 20])
    lens = parse_spec("llama3-8b:spread:64:128-8192")[1]
    assert len(lens) == 64 and lens[0] == 128 and lens[-1] == 8192 and lens == sorted(lens)
    for bad in ("llama3-8b", "llama3-8b:", ":5x1", "m:5x0", "m:0x3", "m:5", "m:5x1x2", "m:5x1+",
                "m:spread:0:1-2", "m:spread:3:9-2", "m:spread:3:1", "m:spread:3:-1-2", "m:spread:x:1-2"):
        try:
            parse_spec(bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad!r}")
    print("self-test ok")


if __name__ == "__main__" and "--self-test" in sys.argv:
    sys.exit(self_test())

torch = bp = None  # imported in main(), once --peers-dir is known


class RaggedCase:
    """bench_peers.Case's attributes (what Vllm and Sglang read), for per-sequence
    lengths `lens`: each sequence owns ceil(len/BLOCK) blocks of a shuffled pool."""

    def __init__(self, lens, h, hkv, d, sets):
        dev, blk = bp.DEV, bp.BLOCK
        self.lens, self.B, self.h, self.hkv, self.d = lens, len(lens), h, hkv, d
        self.s = max(lens)  # vLLM's max_seqlen_k (its bf16 path ignores it)
        self.nblk = [math.ceil(n / blk) for n in lens]
        per_set = sum(self.nblk)
        self.k = torch.randn(per_set * sets, blk, hkv, d, dtype=torch.bfloat16, device=dev)
        self.v = torch.randn_like(self.k)
        perm = torch.randperm(per_set * sets, device=dev, dtype=torch.int32).view(sets, per_set)
        # Rows padded to the longest sequence; pad entries (0, a real block)
        # lie past each sequence's length, so no kernel reads them as KV.
        self.block_tables = torch.zeros(sets, self.B, max(self.nblk), dtype=torch.int32, device=dev)
        start = 0
        for b, n in enumerate(self.nblk):
            self.block_tables[:, b, :n] = perm[:, start:start + n]
            start += n
        self.q = [torch.randn(self.B, h, d, dtype=torch.bfloat16, device=dev) for _ in range(sets)]
        self.seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
        self.cu_q = torch.arange(self.B + 1, dtype=torch.int32, device=dev)
        # SGLang: page-size-1 slots of the same pool. Masking each row to its
        # own length and flattening concatenates the sequences in batch order.
        width = max(self.nblk) * blk
        own = torch.arange(width, device=dev) < self.seq_lens.long()[:, None]
        self.kv_indices = []
        for i in range(sets):
            tok = (self.block_tables[i].long()[..., None] * blk
                   + torch.arange(blk, device=dev)).view(self.B, width)
            self.kv_indices.append(tok[own].contiguous())
        self.kv_indptr = torch.zeros(self.B + 1, dtype=torch.int32, device=dev)
        self.kv_indptr[1:] = torch.cumsum(self.seq_lens, 0)
        self.sets = sets
        self.scale = 1.0 / math.sqrt(d)

    def kv_bytes(self):
        return 2 * sum(self.lens) * self.hkv * self.d * 2

    def reference(self, i):
        """float32 attention of set i, each sequence over its own tokens only."""
        g, out = self.h // self.hkv, []
        for b, n in enumerate(self.lens):
            bt = self.block_tables[i, b, : self.nblk[b]].long()
            k = self.k[bt].view(-1, self.hkv, self.d)[:n].float()
            v = self.v[bt].view(-1, self.hkv, self.d)[:n].float()
            q = self.q[i][b].float().view(self.hkv, g, self.d)
            p = torch.softmax(torch.einsum("kgd,skd->kgs", q, k) * self.scale, dim=-1)
            out.append(torch.einsum("kgs,skd->kgd", p, v).reshape(self.h, self.d))
        return torch.stack(out)


def main():
    global torch, bp
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", required=True, help="SPEC[,SPEC...]")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "peers_ragged.csv"))
    ap.add_argument("--peers-dir", default=os.environ.get("PEERS_DIR", os.path.join(repo, ".gpu", "peers")))
    a = ap.parse_args()
    try:
        specs = [(x, *parse_spec(x)) for x in a.batches.split(",")]
    except ValueError as e:
        sys.exit(str(e))
    sys.path.insert(0, os.path.abspath(a.peers_dir))
    import bench_peers as bp  # puts the peers' stubs/ and pkgs/ on sys.path
    import torch, triton
    for spec, m, _ in specs:
        if m not in bp.MODELS:
            sys.exit(f"{spec}: unknown model {m!r}, want one of {', '.join(bp.MODELS)}")

    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    bw, rbw = bp.copy_bandwidth(), bp.read_bandwidth()
    print(f"# {props.name} SMs={props.multi_processor_count} copy_bw={bw/1e12:.2f} TB/s read_bw={rbw/1e12:.2f} TB/s "
          f"torch={torch.__version__} triton={triton.__version__}")
    rows = []
    for spec, mname, lens in specs:
        h, hkv, d = bp.MODELS[mname]
        B, s = len(lens), max(lens)
        kvb = 2 * sum(lens) * hkv * d * 2
        sets = min(64, max(1, math.ceil(bp.L2_FLUSH_BYTES / kvb)))
        print(f"# {spec}: B={B} s={s} tokens={sum(lens)} KV={kvb / 2**20:.1f} MiB sets={sets}")
        print(f"{'model':16} {'B':>4} {'s':>6} {'peer':14} {'mode':10} {'us':>9} {'TB/s':>6} {'%copy':>6} {'relerr':>8}")
        c = RaggedCase(lens, h, hkv, d, sets)
        ref = c.reference(0)
        for P in (bp.Vllm, bp.Sglang):
            p = P(c)
            if P is bp.Sglang:
                # Sglang names the split count of sequence 0 only; ragged
                # lengths get a count per sequence, so show the range.
                lo, hi = int(p.splits.min()), int(p.splits.max())
                p.mode = f"splits={lo}" if lo == hi else f"splits={lo}-{hi}"
            out = p.run(0).float()
            err = ((out - ref).norm() / ref.norm()).item()
            us = bp.time_graph(p.run, sets)
            add_row(rows, mname, B, s, P.name, p.mode, us, kvb + 2 * B * h * d * 2, bw, err, 10)
        del c, ref, p
        torch.cuda.empty_cache()
        write_rows(a.out, rows)  # every spec, so a timeout keeps what ran


if __name__ == "__main__":
    main()
