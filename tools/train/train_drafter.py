#!/usr/bin/env python3
"""Train the DFlash drafter (dflash.py) on the trained target's own greedy continuations.

1. Prompts: `--n-prompts` windows of `--prompt-len` tokens at seeded random offsets of the train split's token
   stream (held-out documents are never used for training; `--heldout-prompts` windows of the held-out stream
   are used only to evaluate the drafter).
2. The target (the exported HF checkpoint, float32, TF32 off) continues each prompt greedily for `--gen-len`
   tokens (batched, with transformers' KV cache).
3. One float32 target forward over each whole sequence records the tapped layers' outputs (decoder layer j's
   output after its residual add, before the final norm - captured with forward hooks; transformers'
   output_hidden_states would give the final-normed state for the last layer).
4. Training example: a sequence and an anchor O in the generated part (O >= prompt_len, O + K - 1 < length):
   context rows = positions < O, block = [tokens[O], mask x (K-1)] at positions O .. O+K-1, loss =
   cross-entropy of block rows 1..K-1 against the target's greedy tokens tokens[O+1 .. O+K-1], weighted
   exp(-(j-1)/7) per row j (earlier rows matter more for acceptance). Many anchors per sequence share one
   forward (see dflash.block_mask).
5. Early stopping on held-out loss, best weights exported as bf16 safetensors with the spec's tensor names,
   plus config.json in the format of the Laguna XS 2.1 dflash-config.json.
Acceptance is measured by the engine (`fastdecode bench`), not here; this script reports only the drafter's
teacher-forced per-row accuracy as a training metric.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import common
import dflash
from common import log


@torch.no_grad()
def greedy(model, prompts: torch.Tensor, gen_len: int, batch: int, device) -> torch.Tensor:
    out = []
    for i in range(0, len(prompts), batch):
        x = prompts[i:i + batch].to(device, dtype=torch.long)
        res = model(input_ids=x, use_cache=True, logits_to_keep=1)
        past = res.past_key_values
        nxt = res.logits[:, -1].argmax(-1)
        toks = [nxt]
        for _ in range(gen_len - 1):
            res = model(input_ids=nxt[:, None], past_key_values=past, use_cache=True, logits_to_keep=1)
            past = res.past_key_values
            nxt = res.logits[:, -1].argmax(-1)
            toks.append(nxt)
        out.append(torch.cat([x, torch.stack(toks, 1)], 1).cpu())
        del past, res
    return torch.cat(out)


@torch.no_grad()
def tapped(model, seqs: torch.Tensor, layer_ids: list[int], batch: int, device) -> torch.Tensor:
    """[N, L] tokens -> [N, L, T, D] float32 outputs of the tapped decoder layers (on `device`)."""
    store: dict[int, torch.Tensor] = {}
    hooks = common.tap_hooks(model, layer_ids, store)
    out = []
    for i in range(0, len(seqs), batch):
        model(input_ids=seqs[i:i + batch].to(device, dtype=torch.long), use_cache=False, logits_to_keep=1)
        out.append(torch.stack([store[j].float() for j in layer_ids], dim=2))
    for h in hooks:
        h.remove()
    return torch.cat(out)


def row_weights(k: int, device) -> torch.Tensor:
    j = torch.arange(1, k, device=device, dtype=torch.float32)
    return torch.exp(-(j - 1) / 7.0)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--corpus-dir", type=Path, default=common.ROOT / ".cache/train-in")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--metrics", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--taps", default="1,2,4")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--rope-theta", type=float, default=500000.0)
    ap.add_argument("--n-prompts", type=int, default=32768)
    ap.add_argument("--heldout-prompts", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=192)
    ap.add_argument("--gen-batch", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--anchors", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--steps", type=int, default=0, help="schedule length; 0 = calibrate to --time-budget")
    ap.add_argument("--max-steps", type=int, default=20000)
    ap.add_argument("--time-budget", type=float, default=110.0)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--patience", type=int, default=3)
    ap.add_argument("--max-train-docs", type=int, default=0, help="smoke tests only")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return ap.parse_args()


def load_target(path: Path, device):
    """The trained target in float32 on `device`, frozen: it only generates and is tapped."""
    target = common.load_hf(path, dtype=torch.float32, experts_impl="dense_train", attn_impl="sdpa")
    target = target.to(device).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    return target


def sequences(target, taps: list[int], gen: torch.Generator, args, device):
    """The train and held-out prompts (drawn from `gen`), the target's greedy continuations of
    them (on `device`) and their tapped hidden states; with the seconds the continuations took."""
    tok = common.load_tokenizer(args.target / "tokenizer.json")
    train_docs = common.read_docs(common.find_corpus(args.corpus_dir, "train"))
    if args.max_train_docs:
        train_docs = train_docs[:args.max_train_docs]
    held_docs = common.read_docs(common.find_corpus(args.corpus_dir, "heldout"))
    train_stream = common.token_stream(common.encode_docs(tok, train_docs))
    held_stream = common.token_stream(common.encode_docs(tok, held_docs))

    def prompts_from(stream, n):
        starts = torch.randint(0, len(stream) - args.prompt_len, (n,), generator=gen)
        return stream[starts[:, None] + torch.arange(args.prompt_len)[None, :]].long()

    tr_prompts = prompts_from(train_stream, args.n_prompts)
    he_prompts = prompts_from(held_stream, args.heldout_prompts)
    t0 = time.time()
    tr_seqs = greedy(target, tr_prompts, args.gen_len, args.gen_batch, device)
    he_seqs = greedy(target, he_prompts, args.gen_len, args.gen_batch, device)
    t_gen = time.time() - t0
    log(f"greedy continuations: {len(tr_seqs)} train + {len(he_seqs)} held-out sequences of {tr_seqs.shape[1]} "
        f"tokens in {t_gen:.1f}s")
    t0 = time.time()
    tr_taps = tapped(target, tr_seqs, taps, args.gen_batch // 4, device)
    he_taps = tapped(target, he_seqs, taps, args.gen_batch // 4, device)
    log(f"tapped hidden states {tuple(tr_taps.shape)} in {time.time() - t0:.1f}s")
    tr_seqs, he_seqs = tr_seqs.to(device), he_seqs.to(device)
    return tr_seqs, he_seqs, tr_taps, he_taps, t_gen


def drafter_config(tcfg, taps: list[int], args) -> dict:
    """The drafter's config.json, in the format of the Laguna XS 2.1 dflash-config.json."""
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "laguna",
        "decoder_layer_type": "laguna_xs",
        "gating": "per-head",
        "hidden_size": tcfg.hidden_size,
        "num_hidden_layers": args.layers,
        "intermediate_size": args.ffn,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": tcfg.head_dim,
        "vocab_size": tcfg.vocab_size,
        "rms_norm_eps": tcfg.rms_norm_eps,
        "rope_theta": args.rope_theta,
        "max_position_embeddings": tcfg.max_position_embeddings,
        "sliding_window": tcfg.sliding_window,
        "layer_types": ["sliding_attention"] * args.layers,
        "tie_word_embeddings": False,
        "block_size": args.block,
        "num_target_layers": tcfg.num_hidden_layers,
        "dflash_config": {"target_layer_ids": taps, "mask_token_id": common.MASK},
    }


def save(best_state: dict, dcfg: dict, t: int, args):
    """The best weights as bf16 safetensors (the spec's tensor names, checked) and the config
    in `--out`; returns the saved state dict and the safetensors' path."""
    from safetensors.torch import save_file
    sd = {kk: v.to(torch.bfloat16).contiguous() for kk, v in best_state.items()}
    want = {"fc.weight", "hidden_norm.weight", "norm.weight"} | {f"aux_hidden_norms.{j}.weight" for j in range(t)}
    for i in range(args.layers):
        p = f"layers.{i}."
        want |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
        want |= {p + f"self_attn.{n}.weight" for n in ("q_proj", "k_proj", "v_proj", "o_proj", "g_proj",
                                                       "q_norm", "k_norm")}
        want |= {p + f"mlp.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj")}
    assert set(sd) == want, set(sd) ^ want
    args.out.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(args.out / "model.safetensors"), metadata={"format": "pt"})
    (args.out / "config.json").write_text(json.dumps(dcfg, indent=2) + "\n")
    st = args.out / "model.safetensors"
    return sd, st


def main() -> int:
    args = parse_args()
    t_start = time.time()
    common.seed_all(args.seed)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    use_autocast = device.type == "cuda" or os.environ.get("FD_AUTOCAST_CPU") == "1"  # (CPU: smoke tests)

    target = load_target(args.target, device)
    tcfg = target.config
    taps = [int(x) for x in args.taps.split(",")]
    assert taps[-1] == tcfg.num_hidden_layers - 1 and all(0 <= t < tcfg.num_hidden_layers for t in taps)
    k = args.block
    window = tcfg.sliding_window

    gen = torch.Generator().manual_seed(args.seed)
    tr_seqs, he_seqs, tr_taps, he_taps, t_gen = sequences(target, taps, gen, args, device)

    dcfg = drafter_config(tcfg, taps, args)
    drafter = dflash.DFlashDrafter(dcfg).to(device)
    n_params = sum(p.numel() for p in drafter.parameters())
    log(f"drafter: {n_params:,} parameters ({2 * n_params / 1e6:.2f} MB in bf16)")
    embed, lm_head = target.model.embed_tokens, target.lm_head
    decay = [p for p in drafter.parameters() if p.ndim >= 2]
    no_decay = [p for p in drafter.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=device.type == "cuda")
    wrow = row_weights(k, device)
    p_len, seq_len = args.prompt_len, tr_seqs.shape[1]
    lo, hi = p_len, seq_len - k  # anchor range (inclusive)

    def loss_of(seqs, tps, anchors):
        ctx = drafter.context(tps)
        logits = dflash.drafter_logits(drafter, embed, lm_head, seqs, ctx, anchors, k, common.MASK, window)
        rows = logits[:, :, 1:].float()  # [B, A, K-1, V]
        labels = seqs.gather(1, (anchors[:, :, None] + torch.arange(1, k, device=device)).flatten(1))
        labels = labels.view(*anchors.shape, k - 1)
        ce = F.cross_entropy(rows.reshape(-1, rows.shape[-1]), labels.reshape(-1), reduction="none")
        ce = ce.view_as(labels)
        loss = (ce * wrow).sum(-1).mean() / wrow.sum()
        return loss, (rows.argmax(-1) == labels)

    # fixed held-out anchors: every 8th position of the generated part
    he_anchor_row = torch.arange(lo, hi + 1, 8, device=device)

    @torch.no_grad()
    def evaluate():
        drafter.eval()
        tot, cor, n = 0.0, torch.zeros(k - 1, device=device), 0
        for i in range(0, len(he_seqs), args.batch):
            s, t = he_seqs[i:i + args.batch], he_taps[i:i + args.batch]
            anc = he_anchor_row[None].expand(len(s), -1)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_autocast):
                loss, ok = loss_of(s, t, anc)
            tot += loss.item() * len(s)
            cor += ok.float().sum(dim=(0, 1))
            n += ok.shape[0] * ok.shape[1]
        drafter.train()
        return tot / len(he_seqs), (cor / n).tolist()

    total_steps = args.steps or args.max_steps
    calibrated = bool(args.steps)
    best = (math.inf, -1, None, None)
    bad = 0
    history = []
    stop_reason = "max_steps"
    t_train = time.time()
    step = 0
    t_cal = None
    while step < total_steps:
        idx = torch.randint(0, len(tr_seqs), (args.batch,), generator=gen).to(device)
        anchors = torch.randint(lo, hi + 1, (args.batch, args.anchors), generator=gen).to(device)
        lr = common.lr_at(step, total_steps, args.lr, args.warmup, 0.1)
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_autocast):
            loss, ok = loss_of(tr_seqs[idx], tr_taps[idx], anchors)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        step += 1
        if step == 20:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t_cal = time.time()
        if step == 70 and not calibrated:
            if device.type == "cuda":
                torch.cuda.synchronize()
            per = (time.time() - t_cal) / 50
            remaining = args.time_budget - (time.time() - t_train)
            total_steps = max(step + 1, min(args.max_steps, step + int(remaining / (per * 1.08))))
            calibrated = True
            log(f"calibration: {per * 1000:.1f} ms/step -> schedule of {total_steps} steps")
        if step % 50 == 0 or step == 1:
            log(f"step {step}/{total_steps} loss {loss.item():.4f} row-1 acc {ok[..., 0].float().mean().item():.3f} "
                f"lr {lr:.2e}")
        last = step >= total_steps
        over = time.time() - t_train > args.time_budget
        if step % args.eval_every == 0 or last or over:
            hl, acc = evaluate()
            history.append({"step": step, "heldout_loss": hl, "heldout_row_accuracy": acc,
                            "seconds": time.time() - t_train})
            log(f"eval step {step}: held-out loss {hl:.4f}, row accuracy 1/2/4/8/15: "
                f"{acc[0]:.3f} {acc[1]:.3f} {acc[3]:.3f} {acc[7]:.3f} {acc[14]:.3f}")
            if hl < best[0] - 1e-4:
                best = (hl, step, {kk: v.detach().to("cpu", copy=True) for kk, v in drafter.state_dict().items()},
                        acc)
                bad = 0
            else:
                bad += 1
                if bad >= args.patience:
                    stop_reason = f"early stop: no held-out improvement in {args.patience} evaluations"
                    break
        if over and not last:
            stop_reason = "time budget"
            break
    train_seconds = time.time() - t_train
    log(f"drafter training stopped at step {step} ({stop_reason}); best held-out loss {best[0]:.4f} at {best[1]}")

    sd, st = save(best[2], dcfg, len(taps), args)
    metrics = {
        "drafter_heldout_loss_weighted_ce": best[0],
        "drafter_heldout_row_accuracy_teacher_forced": best[3],
        "drafter_best_step": best[1],
        "drafter_steps": step,
        "drafter_schedule_steps": total_steps,
        "drafter_stop_reason": stop_reason,
        "drafter_train_seconds": train_seconds,
        "drafter_total_seconds": time.time() - t_start,
        "greedy_generation_seconds": t_gen,
        "train_sequences": len(tr_seqs),
        "heldout_sequences": len(he_seqs),
        "drafter_params": n_params,
        "drafter_safetensors_bytes": st.stat().st_size,
        "drafter_safetensors_sha256": common.sha256_file(st),
        "drafter_tensor_shapes": {kk: list(v.shape) for kk, v in sorted(sd.items())},
        "args": {kk: str(v) if isinstance(v, Path) else v for kk, v in vars(args).items()},
        "history": history,
        "note": "row accuracy = fraction of held-out blocks whose draft row j equals the target's greedy token "
                "(teacher-forced context); acceptance lengths are measured by the engine, not here.",
    }
    mpath = args.metrics or args.out.parent / "drafter-metrics.json"
    mpath.write_text(json.dumps(metrics, indent=1) + "\n")
    log(f"wrote {args.out} ({st.stat().st_size:,} bytes) and {mpath}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
