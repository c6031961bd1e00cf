#!/usr/bin/env python3
"""A timeline model of the streamed decode step (docs/streamed-step.md): what step time a given
link cost, stream rate, consumer rate and ring size allow for E4B's operations, so the
prototype's measurements can be read against it and the next fix chosen by what it buys.

Every SM is modelled alike (the K-split shares are balanced). One producer streams the SM's
weights into a ring of RING bytes at STREAM bytes/us whenever the ring has room; the consumers
of operation k start LINK us after operation k-1 finished (publish, wait, read the input and
the operation's fixed work) and multiply its BYTES at CELLS bytes/us, never faster than the
stream delivers them. Attention operations have no weights: ATTN us of work after their link.
The step ends when lm_head is done. A model, not a measurement: its constants come from
docs/performance.md ("The streamed step", ninth and tenth sessions) and are printed with every
result.

Usage: scripts/stream_model.py            (calibration against the prototype, then what-ifs)
       scripts/stream_model.py --link 2.0 --stream 34 --cells 75 --ring 132 [--attn 5 --ctx]
"""
import argparse

H, FF, PLE, LAYERS, VOCAB = 2560, 10240, 256, 42, 262144


def cell_bytes(rows, k, fmt):
    # int4 cells: 16 x 128 nibbles + 16 bf16 scales = 1,056 bytes; bf16 cells: 16 x 64 x 2.
    return rows * k // 2 * 1056 // 1024 if fmt == "int4" else rows * k * 2


def e4b_ops(fmt, attention):
    """(name, bytes) in step order; bytes of weights for the whole GPU."""
    ops = [("ple_model", cell_bytes(LAYERS * PLE, H, fmt))]
    for l in range(LAYERS):
        hd = 256 if l % 6 != 5 else 512
        qkv = 8 * hd + (4 * hd if l < 24 else 0)
        ops.append(("qkv", cell_bytes(qkv, H, fmt)))
        if attention:
            ops.append(("attn", 0))
        ops += [("o", cell_bytes(H, 8 * hd, fmt)), ("gate_up", cell_bytes(2 * FF, H, fmt)),
                ("down", cell_bytes(H, FF, fmt)), ("ple_gate", cell_bytes(PLE, H, fmt)),
                ("ple_proj", cell_bytes(H, PLE, fmt))]
    ops.append(("lm_head", cell_bytes(VOCAB, H, fmt)))
    return ops


def simulate(ops, n_sm, link, stream, cells, ring_kb, attn_us, dt=0.002):
    """Step time in us. stream, cells: KB/us per SM; ring: KB; link, attn: us."""
    ring = ring_kb * 1e3
    rs, rc = stream * 1e3, cells * 1e3  # bytes/us
    t = 0.0
    produced = consumed = 0.0
    total = sum(b for _, b in ops) / n_sm
    for name, b in ops:
        need = consumed + b / n_sm
        # The link: the consumers wait; the producer fills the ring.
        room = consumed + ring - produced
        produced += min(room, rs * link, total - produced)
        t += link
        if name == "attn":
            room = consumed + ring - produced
            produced += min(room, rs * attn_us, total - produced)
            t += attn_us
            continue
        # Consumption: at the cells' rate while data is there, else as it arrives.
        while consumed < need - 1e-9:
            avail = produced - consumed
            step_c = min(rc * dt, need - consumed)
            if avail >= step_c:
                consumed += step_c
            else:
                consumed += avail
            room = consumed + ring - produced
            produced += min(room, rs * dt, total - produced)
            t += dt
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--link", type=float)
    ap.add_argument("--stream", type=float, help="KB/us per SM")
    ap.add_argument("--cells", type=float, help="KB/us per SM")
    ap.add_argument("--ring", type=float, help="KB")
    ap.add_argument("--attn", type=float, default=5.0, help="us of attention work after its link")
    ap.add_argument("--ctx", action="store_true", help="with attention operations")
    ap.add_argument("--fmt", default="int4", choices=["int4", "bf16"])
    ap.add_argument("--sms", type=int, default=132)
    a = ap.parse_args()
    if a.link is not None:
        ops = e4b_ops(a.fmt, a.ctx)
        t = simulate(ops, a.sms, a.link, a.stream, a.cells, a.ring, a.attn)
        print(f"{a.fmt}, link {a.link} us, stream {a.stream} KB/us/SM, cells {a.cells} KB/us/SM, "
              f"ring {a.ring} KB{', attention ' + str(a.attn) + ' us' if a.ctx else ''}: "
              f"{t / 1e3:.3f} ms ({1e6 / t:.0f} tok/s)")
        return
    rows = [
        # (label, fmt, ctx, link, stream, cells, ring, attn)
        ("prototype W4A8, ninth session (link = --tiny 3.21, stream with consumers 22, cells 75, ring 132)",
         "int4", False, 3.21, 22.1, 75, 132, 0),
        ("  measured: 1.641 ms", None, None, None, None, None, None, None),
        ("prototype W4A8, tenth session (link = --tiny 2.9, stream with consumers 30, cells 75, ring 181)",
         "int4", False, 2.9, 30, 75, 181, 0),
        ("  measured: 1.301 ms", None, None, None, None, None, None, None),
        ("  same + attention (attention 4 us after its link, ring 132)", "int4", True, 2.9, 30, 75, 132, 4),
        ("  measured: 1.738 ms", None, None, None, None, None, None, None),
        ("prototype bf16, ninth session (link 3.21, stream 28.5 (32-KB chunks), cells 148, ring 96)",
         "bf16", False, 3.21, 28.5, 148, 96, 0),
        ("  measured: 3.392 ms (tenth session: 3.016)", None, None, None, None, None, None, None),
        ("W4A8, link at the floor (2.0), stream at the producer's 3.6 TB/s (27)", "int4", False, 2.0, 27, 75, 132, 0),
        ("W4A8, link 2.0, stream 4.5 TB/s (34)", "int4", False, 2.0, 34, 75, 132, 0),
        ("W4A8 + attention (link 2.0, attention 3 us), stream 34", "int4", True, 2.0, 34, 75, 132, 3),
        ("W4A8 + attention (link 2.5, attention 5 us), stream 30", "int4", True, 2.5, 30, 75, 132, 5),
        ("bf16 + attention (link 2.0, attention 3 us), stream 34, ring 160", "bf16", True, 2.0, 34, 148, 160, 3),
    ]
    for label, fmt, ctx, link, stream, cells, ring, attn in rows:
        if fmt is None:
            print(label)
            continue
        t = simulate(e4b_ops(fmt, ctx), a.sms, link, stream, cells, ring, attn)
        print(f"{label}: {t / 1e3:.3f} ms ({1e6 / t:.0f} tok/s)")


if __name__ == "__main__":
    main()
