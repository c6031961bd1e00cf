#!/usr/bin/env python3
"""Cross-check against HF `tokenizers`: convert the GGUF score vocabulary into a tokenizer.json (every
split of every token into two pieces, ranked by the merged token's score), then tokenize the llama.cpp
reference texts and the decoded perplexity records with HF's BPE.

    pip install gguf tokenizers
    python3 hf_crosscheck.py MODEL.gguf DATA_DIR [OUT_IDS.json]    # DATA_DIR: the repository's data/

Prints agreement with the reference ids; OUT_IDS.json (optional) receives [[record id, ids], ...] for
comparison with this crate's output.
"""
import json
import sys

from gguf import GGUFReader
from tokenizers import Tokenizer

gguf_path, data = sys.argv[1], sys.argv[2]
r = GGUFReader(gguf_path)
toks = r.fields["tokenizer.ggml.tokens"].contents()
scores = r.fields["tokenizer.ggml.scores"].contents()
types = r.fields["tokenizer.ggml.token_type"].contents()
tid = {t: i for i, t in enumerate(toks)}  # later duplicates win, as in llama.cpp

merges = []
for i, t in enumerate(toks):
    if tid.get(t) != i:
        continue
    local = sorted((tid[t[:c]], tid[t[c:]]) for c in range(1, len(t)) if t[:c] in tid and t[c:] in tid)
    merges.extend((scores[i], a, b) for a, b in local)
merges.sort(key=lambda m: -m[0])  # stable: equal scores keep vocabulary order

added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
          "normalized": False, "special": types[i] != 4}
         for i, t in enumerate(toks) if types[i] in (2, 3, 4)]
tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
      "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
      "pre_tokenizer": None, "post_processor": None, "decoder": None,
      "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                "vocab": tid, "merges": [[toks[a], toks[b]] for _, a, b in merges]}}
tk = Tokenizer.from_str(json.dumps(tj, ensure_ascii=False))


def detok(ids):
    out = bytearray()
    for i in ids:
        t, ty = toks[i], types[i]
        if ty == 6:
            out.append(int(t[3:5], 16))
        elif ty == 1:
            out += t.replace("\u2581", " ").encode()
        else:
            out += t.encode()
    return out.decode("utf-8", "replace")


ref = json.load(open(f"{data}/reference/gemma3-270m-tokenize.json"))
ok = sum(tk.encode(c["text"], add_special_tokens=False).ids == c["ids"] for c in ref)
print(f"reference texts: {ok}/{len(ref)} identical to llama.cpp")

same, out = 0, []
for line in open(f"{data}/challenge/ppl_ground_truth_tokens.jsonl"):
    rec = json.loads(line)
    ids = rec["context_token_ids"] + rec["target_token_ids"]
    got = tk.encode(detok(ids), add_special_tokens=False).ids
    same += got == ids
    out.append([rec["id"], got])
print(f"perplexity records: {same}/{len(out)} round-trip exactly")
if len(sys.argv) > 3:
    json.dump(out, open(sys.argv[3], "w"))
