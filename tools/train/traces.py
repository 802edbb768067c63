#!/usr/bin/env python3
"""Greedy-decoding parity traces from HF transformers in float32 on the saved HF target checkpoint.

Prompts: the first `--n` held-out documents (in the corpus' held-out file order) with at least 200 tokens;
prompt = [<|bos|>] + the document's first Lp tokens, Lp = 32 + int(sha256(id)[:8], 16) % 33 (32..64).
Decoding: `--new` steps; each step runs a full float32 forward of the whole sequence so far (no KV cache),
eager attention and transformers' eager (per-expert loop) MoE, on the CPU; the next token is argmax of the last
row's logits (torch.argmax: the lowest id among exact ties). Decoding does not stop at <|eos|>.
Recorded per step: the token id, the top-2 ids and their logits (float32 values, written exactly as decimals).

Output: one JSON file with the model digest (sha256 of model.safetensors), the prompts and the steps.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch

import common
from common import log


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--corpus-dir", type=Path, default=common.ROOT / ".cache/train-in")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--min-doc-tokens", type=int, default=200)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    torch.set_num_threads(os.cpu_count() or 1)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    model = common.load_hf(args.target, dtype=torch.float32, experts_impl="eager", attn_impl="eager").to(device)
    tok = common.load_tokenizer(args.target / "tokenizer.json")
    held = common.read_docs(common.find_corpus(args.corpus_dir, "heldout"))

    prompts = []
    for d in held:
        ids = tok.encode(d["text"]).ids
        if len(ids) < args.min_doc_tokens:
            continue
        lp = 32 + int(hashlib.sha256(d["id"].encode()).hexdigest()[:8], 16) % 33
        prompts.append((d["id"], [common.BOS] + ids[:lp]))
        if len(prompts) == args.n:
            break
    assert len(prompts) == args.n, f"only {len(prompts)} held-out documents with {args.min_doc_tokens}+ tokens"

    t0 = time.time()
    out_prompts = []
    min_gap = float("inf")
    small_gaps = 0
    # All prompts decode together: at each step the sequences are right-padded to a common length and each
    # one's logits are read at its own last real row. Causal attention and the per-token MLP / MoE make the
    # padding invisible to the real rows (the batch changes only the BLAS blocking, not the function).
    seqs = [list(p) for _, p in prompts]
    steps = [[] for _ in prompts]
    with torch.no_grad():
        for t in range(args.new):
            width = max(len(s) for s in seqs)
            x = torch.full((len(seqs), width), common.PAD, dtype=torch.long)
            for i, s in enumerate(seqs):
                x[i, :len(s)] = torch.tensor(s)
            logits_all = model(input_ids=x.to(device), use_cache=False).logits.float().cpu()
            for i, s in enumerate(seqs):
                logits = logits_all[i, len(s) - 1]
                top = torch.topk(logits, 2)
                nxt = int(torch.argmax(logits))
                assert logits[nxt] == top.values[0]
                gap = float(top.values[0] - top.values[1])
                min_gap = min(min_gap, gap)
                small_gaps += gap < 1e-3
                steps[i].append({"token": nxt, "top2_ids": [int(j) for j in top.indices],
                                 "top2_logits": [float(v) for v in top.values]})
                s.append(nxt)
            if (t + 1) % 32 == 0:
                log(f"step {t + 1}/{args.new}")
    for (doc_id, pids), st_i in zip(prompts, steps):
        gen_ids = [s["token"] for s in st_i]
        out_prompts.append({
            "doc_id": doc_id,
            "prompt_ids": pids,
            "steps": st_i,
            "prompt_text": tok.decode(pids, skip_special_tokens=False),
            "continuation_text": tok.decode(gen_ids, skip_special_tokens=False),
        })
    st = args.target / "model.safetensors"
    doc = {
        "format": "fastdecode-hf-greedy-traces-v1",
        "model_sha256": common.sha256_file(st),
        "model_file": "model.safetensors",
        "config_sha256": common.sha256_file(args.target / "config.json"),
        "tokenizer_sha256": common.sha256_file(args.target / "tokenizer.json"),
        "reference": {
            "library": "transformers",
            "transformers": __import__("transformers").__version__,
            "torch": torch.__version__,
            "class": "LagunaForCausalLM",
            "dtype": "float32",
            "device": str(device),
            "attn_implementation": "eager",
            "experts_implementation": "eager",
            "kv_cache": "none: full forward of the whole sequence at every step (prompts batched, right-padded)",
        },
        "greedy": "next token = argmax of the last row's float32 logits; decoding continues past <|eos|>",
        "prompt_rule": "first N held-out documents (held-out file order) with >= 200 tokens; [<|bos|>] + first "
                       "32 + int(sha256(doc_id)[:8], 16) % 33 tokens",
        "new_tokens": args.new,
        "min_top2_gap": min_gap,
        "steps_with_top2_gap_below_1e-3": small_gaps,
        "seconds": time.time() - t0,
        "prompts": out_prompts,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=None, separators=(",", ":")) + "\n")
    log(f"wrote {args.out}: {args.n} prompts x {args.new} steps in {time.time() - t0:.1f}s; min top-2 gap "
        f"{min_gap:.3g}, {small_gaps} steps below 1e-3")
    return 0


if __name__ == "__main__":
    sys.exit(main())
