#!/usr/bin/env python3
"""How sensitive are Gemma 3 270M's logits to llama.cpp's own kernel choices? Evaluates the same
tokens once as one batch and once token by token with llama-cpp-python (0.3.36, CPU) and prints
the mean absolute logit difference per position; also 2 threads vs 1.
Usage: pip install llama-cpp-python==0.3.36 (builds llama.cpp from source), then
       scripts/llama_cpp_sensitivity.py [MODEL.gguf]"""
import os
import sys

import numpy as np
from llama_cpp import Llama

PATH = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/hayai/models/gemma-3-270m-q4_k_m.gguf")
m = Llama(model_path=PATH, n_ctx=512, logits_all=True, verbose=False, n_threads=2)
ctx = [2, 818, 5279, 529, 7001, 563, 506, 5279, 529, 506, 2891, 529, 7001, 236761, 1030, 563, 506, 7488, 3207, 528, 7001]
m.reset(); m.eval(ctx); a = np.array([m.scores[i] for i in range(len(ctx))])
m.reset()
for t in ctx: m.eval([t])
b = np.array([m.scores[i] for i in range(len(ctx))])
print("batch vs incremental mean abs diff per pos:", [round(float(np.abs(a[i]-b[i]).mean()),4) for i in range(8)])
m2 = Llama(model_path=PATH, n_ctx=512, logits_all=True, verbose=False, n_threads=1)
m2.eval(ctx); c = np.array([m2.scores[i] for i in range(len(ctx))])
print("2 threads vs 1 thread:", [round(float(np.abs(a[i]-c[i]).mean()),4) for i in range(8)])

# Greedy agreement of llama.cpp with its own reference file when only the prompt's batching
# changes: the prompt as one batch (how the reference was made) vs token by token.
import json
REF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "reference", "gemma3-270m-greedy.json")
for case in json.load(open(REF)):
    for mode in ("batch", "token by token"):
        g = Llama(model_path=PATH, n_ctx=512, logits_all=True, verbose=False, n_threads=2,
                  n_batch=512 if mode == "batch" else 1)
        if mode == "batch":
            g.eval(case["prompt_ids"])
        else:
            for t in case["prompt_ids"]:
                g.eval([t])
        out = []
        for _ in range(len(case["greedy_ids"])):
            t = int(np.argmax(np.array(g.scores[g.n_tokens - 1])))
            out.append(t)
            g.eval([t])
        lead = next((i for i, (x, y) in enumerate(zip(out, case["greedy_ids"])) if x != y), len(out))
        print(f"{case['prompt'][:32]!r}: prompt {mode}: {lead}/{len(out)} leading tokens equal to the reference")
