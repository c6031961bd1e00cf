#!/usr/bin/env python3
"""Build the Gemma 4 parity fixtures for hayai's CPU reference.

Creates small random Gemma 4 models with transformers (fp32, eager attention) that exercise every
feature of the text decoder -- per-layer embeddings, KV sharing, both head dims, a sliding window
shorter than the test sequences, final softcap, layer_scalar != 1, norm weights != 1, both
checkpoint layouts and both spellings of the full-attention head size -- plus a small MTP
assistant, and records transformers' outputs on them:

  <out>/<name>/config.json, model.safetensors   the checkpoint hayai loads
  <out>/<name>/reference.json                   records, PPL, greedy tokens, draft tokens
  <out>/<name>/reference.safetensors            logits (fp32)

Run: python3 scripts/gemma4_fixtures.py --out DIR   (CPU is enough; transformers >= 5.17)
"""

import argparse
import json
import math
import os

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import (
    Gemma4AssistantConfig,
    Gemma4AssistantForCausalLM,
    Gemma4Config,
    Gemma4ForCausalLM,
    Gemma4ForConditionalGeneration,
    Gemma4TextConfig,
)

S, F = "sliding_attention", "full_attention"


def init_weights(model, seed):
    """Deterministic weights with O(1) activations and peaked (not flat) output distributions."""
    g = torch.Generator().manual_seed(seed)

    def normal(shape, std):
        return torch.randn(shape, generator=g) * std

    def uniform(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=g)

    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if "embed_tokens_per_layer" in name:
                # Scaled by sqrt(ple_dim) in the model: unit-variance token part.
                p.copy_(normal(p.shape, 1.0 / math.sqrt(ple_dim(model))))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(normal(p.shape, 1.0 / math.sqrt(p.shape[1])))
            elif name.endswith("q_norm.weight") or name.endswith("k_norm.weight"):
                # q.k with scaling 1.0: keep score std around 2.
                c = math.sqrt(2.0 / math.sqrt(p.shape[0]))
                p.copy_(uniform(p.shape, 0.8 * c, 1.2 * c))
            elif name.endswith("model.norm.weight") or name.endswith("language_model.norm.weight"):
                p.copy_(uniform(p.shape, 1.5, 3.0))
            elif "norm" in name:
                p.copy_(uniform(p.shape, 0.5, 1.5))
            elif p.dim() == 2:
                p.copy_(normal(p.shape, 1.0 / math.sqrt(p.shape[1])))
            else:
                raise RuntimeError(f"unexpected parameter {name} {tuple(p.shape)}")
        for name, b in sorted(model.named_buffers(), key=lambda kv: kv[0]):
            if name.endswith("layer_scalar"):
                b.copy_(uniform(b.shape, 0.5, 1.0))
            elif name.endswith("token_ordering"):
                b.copy_(torch.randperm(b.shape[0], generator=g))


def ple_dim(model):
    cfg = model.config.get_text_config()
    return cfg.hidden_size_per_layer_input or 1


def sample_records(model, n, length, seed, bos=2):
    """Sequences sampled from the model itself (temperature 1), starting with BOS."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.tensor([[bos]])
        with torch.no_grad():
            while ids.shape[1] < length:
                logits = model(input_ids=ids).logits[0, -1].double()
                p = torch.softmax(logits, -1)
                nxt = torch.multinomial(p, 1, generator=g)
                ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
        out.append(ids[0].tolist())
    return out


def ppl_of(model, records):
    nll, count, per_record = 0.0, 0, []
    with torch.no_grad():
        for r in records:
            logits = model(input_ids=torch.tensor([r])).logits[0].double()
            lp = torch.log_softmax(logits, -1)
            tgt = torch.tensor(r[1:])
            s = -lp[:-1].gather(1, tgt.view(-1, 1)).sum().item()
            per_record.append(s)
            nll += s
            count += len(r) - 1
    return math.exp(nll / count), per_record, count


def greedy(model, prompt, n_new):
    """Plain greedy decoding through transformers' KV cache, never stopping early."""
    ids = torch.tensor([prompt])
    out = []
    with torch.no_grad():
        res = model(input_ids=ids, use_cache=True)
        past = res.past_key_values
        nxt = int(res.logits[0, -1].argmax())
        for _ in range(n_new):
            out.append(nxt)
            res = model(input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
            past = res.past_key_values
            nxt = int(res.logits[0, -1].argmax())
    return out


def text_model(model):
    return model.model.language_model if hasattr(model.model, "language_model") else model.model


def write_reference(d, ref, tensors):
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
    save_file({k: v.contiguous().float() for k, v in tensors.items()}, os.path.join(d, "reference.safetensors"))


def finish_checkpoint(d, extra_tensors, config_edit=None):
    """Add unused tensors to the saved checkpoint (a loader must ignore them) and optionally
    rewrite config.json."""
    path = os.path.join(d, "model.safetensors")
    t = load_file(path)
    t.update(extra_tensors)
    save_file(t, path, metadata={"format": "pt"})
    if config_edit is not None:
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        config_edit(cfg)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)


def build_causal(out):
    """Gemma4ForCausalLM layout; head dims via per_layer_config (as transformers 5.x writes)."""
    cfg = Gemma4TextConfig(
        vocab_size=512,
        vocab_size_per_layer_input=512,
        hidden_size=64,
        hidden_size_per_layer_input=8,
        intermediate_size=128,
        num_hidden_layers=7,
        layer_types=[S, S, F, S, S, F, F],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=32,
        num_kv_shared_layers=3,
        sliding_window=8,
        final_logit_softcapping=10.0,
        max_position_embeddings=4096,
        eos_token_id=1,
        bos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=True,
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Gemma4ForCausalLM(cfg).eval().float()
    init_weights(model, 11)
    d = os.path.join(out, "causal")
    model.save_pretrained(d, safe_serialization=True)
    return model, d


def build_conditional(out):
    """Gemma4ForConditionalGeneration layout; `global_head_dim` spelling; double-wide MLP on
    shared layers; k/v tensors of shared layers and a vision tensor left in the file."""
    tc = Gemma4TextConfig(
        vocab_size=512,
        vocab_size_per_layer_input=512,
        hidden_size=64,
        hidden_size_per_layer_input=16,
        intermediate_size=96,
        use_double_wide_mlp=True,
        num_hidden_layers=6,
        layer_types=[S, S, S, F, S, F],
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        global_head_dim=64,
        num_kv_shared_layers=2,
        sliding_window=12,
        final_logit_softcapping=30.0,
        max_position_embeddings=4096,
        eos_token_id=1,
        bos_token_id=2,
        pad_token_id=0,
    )
    cfg = Gemma4Config(text_config=tc, vision_config=None, audio_config=None, tie_word_embeddings=True)
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Gemma4ForConditionalGeneration(cfg).eval().float()
    init_weights(model, 22)
    d = os.path.join(out, "conditional")
    model.save_pretrained(d, safe_serialization=True)
    g = torch.Generator().manual_seed(5)
    extra = {"model.vision_tower.encoder.layers.0.mlp.up_proj.weight": torch.randn(8, 4, generator=g)}
    for i in (4, 5):
        hd = 32 if i == 4 else 64
        pre = f"model.language_model.layers.{i}.self_attn."
        extra[pre + "k_proj.weight"] = torch.randn(hd, 64, generator=g) * 100.0
        extra[pre + "v_proj.weight"] = torch.randn(hd, 64, generator=g) * 100.0
        extra[pre + "k_norm.weight"] = torch.randn(hd, generator=g) * 100.0

    def edit(c):
        t = c["text_config"]
        t.pop("per_layer_config", None)
        t["global_head_dim"] = 64

    finish_checkpoint(d, extra, edit)
    return model, d


def build_assistant(out, target):
    tcfg = target.config.get_text_config()
    atc = Gemma4TextConfig(
        vocab_size=tcfg.vocab_size,
        vocab_size_per_layer_input=0,
        hidden_size=32,
        hidden_size_per_layer_input=0,
        intermediate_size=64,
        num_hidden_layers=4,
        layer_types=[S, S, S, F],
        num_attention_heads=4,
        num_key_value_heads=tcfg.num_key_value_heads,
        head_dim=16,
        global_head_dim=32,
        num_kv_shared_layers=4,
        sliding_window=tcfg.sliding_window,
        final_logit_softcapping=None,
        max_position_embeddings=4096,
    )
    cfg = Gemma4AssistantConfig(
        text_config=atc,
        backbone_hidden_size=tcfg.hidden_size,
        use_ordered_embeddings=True,
        num_centroids=16,
        centroid_intermediate_top_k=4,
        tie_word_embeddings=True,
        eos_token_id=[1, 106],
    )
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Gemma4AssistantForCausalLM(cfg).eval().float()
    init_weights(model, 33)
    d = os.path.join(out, "assistant")
    model.save_pretrained(d, safe_serialization=True)
    return model, d


def draft_reference(target, assistant, prompt, n_draft):
    """Replicates transformers' SinglePositionMultiTokenCandidateGenerator for the first round
    after prefill: target prefill, then `n_draft` assistant steps at the constant position."""
    emb = text_model(target).embed_tokens
    with torch.no_grad():
        res = target(
            input_ids=torch.tensor([prompt]),
            use_cache=True,
            output_hidden_states=True,
            return_shared_kv_states=True,
        )
        first = int(res.logits[0, -1].argmax())
        hidden_last = res.hidden_states[-1][:, -1:]
        normed = text_model(target).norm  # noqa: F841 (documentation of what hidden_states[-1] is)
        # Check the head of the recorded hidden state reproduces the logits (i.e. it is post-norm).
        head = torch.nn.functional.linear(hidden_last, emb.weight)
        cap = target.config.get_text_config().final_logit_softcapping
        if cap:
            head = torch.tanh(head / cap) * cap
        hidden_is_final = float((head[0, 0] - res.logits[0, -1]).abs().max())
        kv = res.shared_kv_states
        ids = prompt + [first]
        current = len(ids)
        kv = {k: (v[0][:, :, :current], v[1][:, :, :current]) for k, v in kv.items()}
        pos = torch.tensor([[current - 1]])
        tok = torch.tensor([[first]])
        h = hidden_last
        toks, logits = [], []
        for _ in range(n_draft):
            e = emb(tok)
            o = assistant(inputs_embeds=torch.cat([e, h], -1), position_ids=pos, shared_kv_states=kv, use_cache=False)
            tok = o.logits.argmax(-1)
            h = o.last_hidden_state
            toks.append(int(tok))
            logits.append(o.logits[0, 0])
    return first, toks, torch.stack(logits), hidden_is_final


def reference_for(model, d, seed, n_records=3, length=40):
    records = sample_records(model, n_records, length, seed)
    ppl, per_record, count = ppl_of(model, records)
    prompt = records[0][:10]
    g = greedy(model, prompt, 30)
    with torch.no_grad():
        logits0 = model(input_ids=torch.tensor([records[0]])).logits[0]
    ref = {
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "records": records,
        "ppl": ppl,
        "nll_per_record": per_record,
        "n_predicted": count,
        "greedy_prompt": prompt,
        "greedy_tokens": g,
    }
    return ref, {"logits_record0": logits0}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--check-against",
        help="directory of previously generated fixtures: report whether this run reproduces them",
    )
    args = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    os.makedirs(args.out, exist_ok=True)

    causal, dc = build_causal(args.out)
    ref, tens = reference_for(causal, dc, 101)
    assistant, da = build_assistant(args.out, causal)
    drafts = []
    for i, plen in enumerate((20, 5)):
        prompt = ref["records"][1 + i % 2][:plen]
        first, toks, dl, hid = draft_reference(causal, assistant, prompt, 4)
        drafts.append({"prompt": prompt, "first_token": first, "draft_tokens": toks, "hidden_head_max_diff": hid})
        tens[f"draft_logits_{i}"] = dl
    ref["drafts"] = drafts
    write_reference(dc, ref, tens)
    print(f"causal: ppl {ref['ppl']:.4f}, greedy {ref['greedy_tokens'][:8]}..., drafts {[x['draft_tokens'] for x in drafts]}")

    cond, dd = build_conditional(args.out)
    ref, tens = reference_for(cond, dd, 202)
    write_reference(dd, ref, tens)
    print(f"conditional: ppl {ref['ppl']:.4f}, greedy {ref['greedy_tokens'][:8]}...")

    if args.check_against:
        report = {}
        for name in ("causal", "conditional"):
            with open(os.path.join(args.out, name, "reference.json")) as f:
                new = json.load(f)
            with open(os.path.join(args.check_against, name, "reference.json")) as f:
                old = json.load(f)
            same_weights = load_file(os.path.join(args.out, name, "model.safetensors")).keys() == load_file(
                os.path.join(args.check_against, name, "model.safetensors")
            ).keys() and all(
                torch.equal(a, load_file(os.path.join(args.check_against, name, "model.safetensors"))[k])
                for k, a in load_file(os.path.join(args.out, name, "model.safetensors")).items()
            )
            report[name] = {
                "weights_identical": same_weights,
                "records_identical": new["records"] == old["records"],
                "greedy_identical": new["greedy_tokens"] == old["greedy_tokens"],
                "drafts_identical": [d["draft_tokens"] for d in new.get("drafts", [])]
                == [d["draft_tokens"] for d in old.get("drafts", [])],
                "ppl_new": new["ppl"],
                "ppl_old": old["ppl"],
            }
        print("reproduction:", json.dumps(report))
        with open(os.path.join(args.out, "reproduction.json"), "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
