#!/usr/bin/env python3
"""Full-size Gemma 4 check: hayai's CPU forward vs transformers on E4B-shaped random weights.

  1. `gemma4_check synth e4b SEED DIR bf16` writes a deterministic E4B-shaped checkpoint.
  2. `gemma4_check logits DIR TOKENS OUT` runs hayai's CPU reference (f32 math on the bf16
     weights, embedding scale rounded to bf16 as transformers does for a bf16 checkpoint).
  3. transformers loads the same checkpoint
       a) in fp32 with the embedding scale set to its bf16 value (same arithmetic as ours), and
       b) in bf16 (transformers' native numerics for this checkpoint),
     and the logits of every position are compared: top-1 agreement and max |difference|.

Writes a JSON summary to --out. Needs ~50 GB host RAM; uses the GPU for transformers when
present.

Run: python3 scripts/gemma4_fullsize_check.py --bin PATH/gemma4_check --preset e4b --out DIR
"""

import argparse
import json
import os
import subprocess
import time

import torch
from safetensors.torch import load_file
from transformers import Gemma4ForConditionalGeneration


def sh(cmd):
    t = time.time()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()
    print(f"$ {' '.join(cmd)}  ({time.time() - t:.1f}s)\n{out}", flush=True)
    return json.loads(out.splitlines()[-1])


def compare(ours, theirs):
    d = (ours - theirs).abs()
    top_o, top_t = ours.argmax(-1), theirs.argmax(-1)
    # How decisive each position is: gap between transformers' top two logits.
    top2 = theirs.topk(2, dim=-1).values
    return {
        "top1_identical": int((top_o == top_t).sum()),
        "positions": int(ours.shape[0]),
        "max_abs_logit_diff": float(d.max()),
        "mean_abs_logit_diff": float(d.mean()),
        "max_abs_logit_diff_per_position": [round(float(x), 5) for x in d.max(-1).values],
        "top1_ours": top_o.tolist(),
        "top1_transformers": top_t.tolist(),
        "transformers_top2_gap": [round(float(x), 4) for x in (top2[:, 0] - top2[:, 1])],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--preset", default="e4b")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--work", default="/tmp/g4full")
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--bf16-only",
        action="store_true",
        help="skip the fp32 transformers run (when the host cannot hold fp32 weights)",
    )
    ap.add_argument("--tokens", default="2,105,2364,107,818,5279,529,7001,563,236881,106,107,105,4368,107,1437")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    model_dir = os.path.join(args.work, args.preset)
    summary = {"preset": args.preset, "seed": args.seed, "tokens": [int(x) for x in args.tokens.split(",")]}

    summary["synth"] = sh([args.bin, "synth", args.preset, str(args.seed), model_dir, "bf16"])
    ours_path = os.path.join(args.work, "ours.safetensors")
    summary["ours"] = sh([args.bin, "logits", model_dir, args.tokens, ours_path])
    ours = load_file(ours_path)["logits"].double()

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    t = time.time()
    model = Gemma4ForConditionalGeneration.from_pretrained(
        model_dir,
        dtype=torch.bfloat16 if args.bf16_only else torch.float32,
        attn_implementation="eager",
        device_map=dev if dev == "cuda" else None,
    ).eval()
    summary["transformers_load_seconds"] = round(time.time() - t, 1)
    ids = torch.tensor([summary["tokens"]], device=dev)
    if not args.bf16_only:
        emb = model.model.language_model.embed_tokens
        scale_bf16 = float(torch.tensor(emb.scalar_embed_scale).to(torch.bfloat16))
        emb.embed_scale.fill_(scale_bf16)
        summary["embed_scale"] = scale_bf16
        with torch.no_grad():
            fp32 = model(input_ids=ids).logits[0].double().cpu()
        summary["vs_transformers_fp32"] = compare(ours, fp32)
        model.to(torch.bfloat16)
    with torch.no_grad():
        bf16 = model(input_ids=ids).logits[0].double().cpu()
    summary["vs_transformers_bf16"] = compare(ours, bf16)
    if not args.bf16_only:
        summary["transformers_fp32_vs_bf16"] = compare(fp32, bf16)
    summary["device"] = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    summary["versions"] = {"torch": torch.__version__, "transformers": __import__("transformers").__version__}
    with open(os.path.join(args.out, f"fullsize_{args.preset}.json"), "w") as f:
        json.dump(summary, f, indent=1)
    for k in ("vs_transformers_fp32", "vs_transformers_bf16", "transformers_fp32_vs_bf16"):
        if k not in summary:
            continue
        s = summary[k]
        print(f"{k}: top-1 {s['top1_identical']}/{s['positions']}, max |diff| {s['max_abs_logit_diff']:.4g}")


if __name__ == "__main__":
    main()
