#!/usr/bin/env python3
"""Generate tests/fixtures/real_model_ref.json: a few rows of selected tensors
of the Gemma 3 270M Q4_K_M GGUF, dequantized by the `gguf` Python package.
Used by tests/real_model.rs to check our dequantizer on real data.

usage: gen_real_model_fixture.py [model.gguf] [out.json]
"""
import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader, quants

HEAD, TAIL = 256, 32
DEFAULT_MODEL = "/root/.cache/hayai/models/gemma-3-270m-q4_k_m.gguf"
# (tensor, rows) - one tensor per type present in the file.
PICKS = [
    ("token_embd.weight", [0, 2, 1000, 262143]),  # Q8_0
    ("blk.0.attn_q.weight", [0, 511, 1023]),  # Q5_0
    ("blk.0.attn_output.weight", [0, 639]),  # Q4_K
    ("blk.0.ffn_down.weight", [0, 300]),  # Q6_K
    ("blk.17.ffn_down.weight", [639]),
    ("output_norm.weight", [0]),  # F32
]


def main(model, out):
    r = GGUFReader(model)
    by_name = {t.name: t for t in r.tensors}
    res = []
    for name, rows in PICKS:
        t = by_name[name]
        qtype = t.tensor_type
        raw = np.asarray(t.data)
        row_len = int(t.shape[0])  # ne0
        flat = quants.dequantize(raw.view(np.uint8), qtype).reshape(-1, row_len)
        res.append({
            "name": name,
            "type": qtype.name,
            "row_len": row_len,
            # f32 bit patterns of the first HEAD and last TAIL values of each row.
            "rows": {
                str(i): {
                    "head": flat[i][:HEAD].astype(np.float32).view(np.uint32).tolist(),
                    "tail": flat[i][-TAIL:].astype(np.float32).view(np.uint32).tolist(),
                }
                for i in rows
            },
        })
    Path(out).write_text(json.dumps(res))
    print(f"wrote {out}")


if __name__ == "__main__":
    here = Path(__file__).resolve().parent.parent
    main(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_MODEL,
         sys.argv[2] if len(sys.argv) > 2 else str(here / "tests/fixtures/real_model_ref.json"))
