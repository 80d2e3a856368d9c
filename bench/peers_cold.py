"""Times the peers' decode-attention kernels cold: in one CUDA graph every
timed call runs right after an unrelated decode that evicts the call's code,
block table and lengths from the caches, as an engine's other kernels do
between two layers' attention. The evictor's own time, measured alone the
same way, is subtracted. Writes bench_peers.py's CSV columns with the mode
`cold/<mode>`, so that compare.py joins it to `decode-attn bench --cold`'s.

The evictor is the same problem as `decode-attn bench --cold`'s (f32,
Llama-3-8B's heads, 8 sequences of 1024 tokens: 64 MiB of dense K and V),
run through torch's scaled_dot_product_attention: an unrelated 64 MiB decode
on another kernel, as ours is for our kernels (ours runs it on our stream
kernel). Peers: vLLM's unified_attention, SGLang's grouped decode kernel and
torch SDPA on dense KV, imported from bench_peers (never copied), each checked
against a float32 reference first.

    python3 bench/peers_cold.py [--shapes MODEL:B:S,...] [--out FILE.csv]

--shapes defaults to the peers' grid; --peers-dir DIR (default $PEERS_DIR,
else .gpu/peers under the repository root, where gpu-stage puts the harness).
"""
import argparse, math, os, sys

from peer_rows import add_row, write_rows


def main():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="", help="MODEL:B:S[,...] (default: the peers' grid)")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "peers_cold.csv"))
    ap.add_argument("--peers-dir", default=os.environ.get("PEERS_DIR", os.path.join(repo, ".gpu", "peers")))
    a = ap.parse_args()
    sys.path.insert(0, os.path.abspath(a.peers_dir))
    import bench_peers as bp  # puts the peers' stubs/ and pkgs/ on sys.path
    import torch, triton

    if a.shapes:
        shapes = [(m, int(b), int(s)) for m, b, s in (x.split(":") for x in a.shapes.split(","))]
    else:
        shapes = [(m, b, s) for m in bp.MODELS for b in (1, 4, 16, 64) for s in (1024, 4096, 16384, 65536)]
    for m, _, _ in shapes:
        if m not in bp.MODELS:
            sys.exit(f"unknown model {m!r}, want one of {', '.join(bp.MODELS)}")

    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    bw = bp.copy_bandwidth()
    # The evictor: 32 query heads over 8 KV heads, d 128, 8 x 1024 tokens, f32.
    ev_q = torch.randn(8, 32, 1, 128, device=bp.DEV)
    ev_k = torch.randn(8, 8, 1024, 128, device=bp.DEV)
    ev_v = torch.randn_like(ev_k)

    def evict():
        torch.nn.functional.scaled_dot_product_attention(ev_q, ev_k, ev_v, enable_gqa=True)

    print(f"# {props.name} SMs={props.multi_processor_count} copy_bw={bw/1e12:.2f} TB/s torch={torch.__version__} "
          f"triton={triton.__version__}; cold: each call after an f32 SDPA decode of 8 x 1024 tokens (64 MiB)")
    print(f"{'model':16} {'B':>4} {'s':>6} {'peer':14} {'mode':16} {'us':>9} {'TB/s':>6} {'%copy':>6} {'relerr':>8}")
    rows = []
    for mname, B, s in shapes:
        h, hkv, d = bp.MODELS[mname]
        kvb = 2 * B * s * hkv * d * 2
        if kvb > 8 << 30:
            continue
        sets = min(64, max(1, math.ceil(bp.L2_FLUSH_BYTES / kvb)))
        evictor_us = bp.time_graph(lambda i: evict(), sets)
        c = bp.Case(B, s, h, hkv, d, sets)
        ref = c.reference(0)
        for P in bp.PEERS:
            p = P(c)
            out = p.run(0).float()
            err = ((out - ref).norm() / ref.norm()).item()

            def cold(i, run=p.run):
                evict()
                run(i)

            us = bp.time_graph(cold, sets) - evictor_us
            add_row(rows, mname, B, s, P.name, f"cold/{p.mode}", us, kvb + 2 * B * h * d * 2, bw, err, 16)
        del c, ref, p
        torch.cuda.empty_cache()
        write_rows(a.out, rows)  # every shape, so a timeout keeps what ran


if __name__ == "__main__":
    main()
