#!/usr/bin/env python3
"""Train the small Laguna target (HF transformers `LagunaForCausalLM`) and export its HF checkpoint.

* Config: common.TARGET_CONFIG (5 layers, full/sliding attention with 4/6 query heads, window 64, YaRN partial
  rotary on full layers as in XS 2.1, dense layer 0, 16 experts top-4 + shared expert, per-head gates).
* Data: the train split as one token stream (<|bos|> doc <|eos|> ...), cut into windows of seq_len + 1 tokens,
  shuffled per epoch by a seeded generator. Held-out loss is measured on the held-out split only.
* Optimiser: AdamW, linear warmup then cosine decay to 10 %; bf16 autocast on CUDA; grad clip 1.0.
* Router: no auxiliary loss; `e_score_correction_bias` is trained the auxiliary-loss-free way (DeepSeek-V3):
  after each step, bias_e += rate * sign(mean load - load_e), so the selection bias feature is exercised.
* Quantisation-aware training: routed and shared experts of sparse layers are NVFP4 fake-quantised in the
  forward with a straight-through backward, so the exported function is the one that was trained.
* Length: the schedule length is `--steps` if given, else calibrated from the measured step time to fit
  `--time-budget`; early stopping ends training when held-out loss has not improved for `--patience`
  evaluations; the best evaluated weights are exported.
* Export: every weight rounded to bf16, experts replaced by their NVFP4 fixed point (see nvfp4.py), saved with
  `save_pretrained` (bf16 safetensors) plus tokenizer.json. The saved checkpoint is then reloaded in float32
  and the held-out loss and perplexity reported are those of that checkpoint.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import common
from common import log


def windows(stream: torch.Tensor, n: int) -> torch.Tensor:
    count = (len(stream) - 1) // n
    idx = torch.arange(count)[:, None] * n + torch.arange(n + 1)[None, :]
    return stream[idx]


@torch.no_grad()
def eval_loss(model, wins: torch.Tensor, device, batch: int, autocast: bool) -> float:
    was = model.training
    model.eval()
    tot, cnt = 0.0, 0
    for i in range(0, len(wins), batch):
        w = wins[i:i + batch].to(device, dtype=torch.long)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=w[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1), reduction="sum")
        tot += loss.item()
        cnt += w[:, 1:].numel()
    model.train(was)
    return tot / cnt


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus-dir", type=Path, default=common.ROOT / ".cache/train-in")
    ap.add_argument("--tokenizer", type=Path, default=common.ROOT / ".cache/train-in/tokenizer.json")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--metrics", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--steps", type=int, default=0, help="schedule length; 0 = calibrate to --time-budget")
    ap.add_argument("--max-steps", type=int, default=20000)
    ap.add_argument("--time-budget", type=float, default=210.0, help="seconds of training")
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--eval-windows", type=int, default=256)
    ap.add_argument("--patience", type=int, default=3)
    ap.add_argument("--bias-rate", type=float, default=1e-3)
    ap.add_argument("--no-qat", action="store_true")
    ap.add_argument("--max-train-docs", type=int, default=0, help="smoke tests only")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return ap.parse_args()


def load_windows(args, t_start: float):
    """The tokenised splits: the held-out documents, both token streams, the train windows,
    all held-out windows and the first `--eval-windows` of them (training's evaluations)."""
    tok = common.load_tokenizer(args.tokenizer)
    train_docs = common.read_docs(common.find_corpus(args.corpus_dir, "train"))
    if args.max_train_docs:
        train_docs = train_docs[:args.max_train_docs]
    held_docs = common.read_docs(common.find_corpus(args.corpus_dir, "heldout"))
    assert not {d["id"] for d in train_docs} & {d["id"] for d in held_docs}
    train_stream = common.token_stream(common.encode_docs(tok, train_docs))
    held_stream = common.token_stream(common.encode_docs(tok, held_docs))
    train_w = windows(train_stream, args.seq_len)
    held_w_all = windows(held_stream, args.seq_len)
    held_w = held_w_all[:args.eval_windows]
    log(f"tokens: train {len(train_stream):,} ({len(train_w)} windows of {args.seq_len}), held-out "
        f"{len(held_stream):,} ({len(held_w_all)} windows); tokenised in {time.time() - t_start:.1f}s")
    return held_docs, train_stream, held_stream, train_w, held_w_all, held_w


def optimizer(model, args, device) -> torch.optim.AdamW:
    """AdamW, weight decay on the matrices but the embedding."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.ndim >= 2 and "embed_tokens" not in name else no_decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")


def router_loads(model):
    """The routers of the sparse layers, and a dict their forward hooks fill with each
    one's latest expert choices (layer -> ids), for the auxiliary-loss-free bias update."""
    loads: dict[int, torch.Tensor] = {}
    routers = {n: l.mlp.gate for n, l in enumerate(model.model.layers) if hasattr(l.mlp, "gate")}
    for n, r in routers.items():
        r.register_forward_hook(lambda m, a, out, n=n: loads.__setitem__(n, out[2].detach()))
    return loads, routers


def export(model, best_state: dict, args) -> dict:
    """The best weights as exported (bf16, experts at their NVFP4 fixed point), saved to
    `--out` with the tokenizer; returns the exported state dict."""
    model.load_state_dict(best_state)
    exported = common.export_state_dict(model)
    model = model.to("cpu")
    model.load_state_dict({k: v.to(torch.float32) for k, v in exported.items()})
    model.set_experts_implementation("eager")
    model = model.to(torch.bfloat16)
    for k, v in model.state_dict().items():
        assert torch.equal(v, exported[k]), k
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(args.out))
    shutil.copy(args.tokenizer, args.out / "tokenizer.json")
    cfg = json.loads((args.out / "config.json").read_text())
    for k in ("_experts_implementation", "experts_implementation"):
        cfg.pop(k, None)
    (args.out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return exported


def check_saved(out: Path, exported: dict, config):
    """The saved file read back: bf16 only, the same tensors as exported, the experts NVFP4
    fixed points. Returns its path and its tensors' shapes."""
    # NB: save_pretrained writes transformers' on-disk Laguna format (per-expert tensors, `shared_expert`,
    # `experts.e_score_correction_bias`), which from_pretrained converts back to the fused in-memory names.
    from safetensors import safe_open
    st = out / "model.safetensors"
    with safe_open(str(st), "pt") as f:
        names = sorted(f.keys())
        shapes = {k: list(f.get_slice(k).get_shape()) for k in names}
        assert all(f.get_slice(k).get_dtype() == "BF16" for k in names)
    reloaded = common.load_hf(out, dtype=torch.bfloat16).state_dict()
    assert set(reloaded) == set(exported), set(reloaded) ^ set(exported)
    for k, v in exported.items():
        assert torch.equal(reloaded[k], v), f"{k} changed in the save/load round trip"
    for k in common.quantized_param_names(config):
        t = reloaded[k].to(torch.float64)
        assert torch.equal(common.nvfp4.fake_quantize(t), t), f"{k} is not an NVFP4 fixed point"
    return st, shapes


def main() -> int:
    args = parse_args()
    t_start = time.time()
    common.seed_all(args.seed)
    device = torch.device(args.device)
    use_autocast = device.type == "cuda" or os.environ.get("FD_AUTOCAST_CPU") == "1"  # (CPU: smoke tests)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    held_docs, train_stream, held_stream, train_w, held_w_all, held_w = load_windows(args, t_start)

    model = common.build_model(common.TARGET_CONFIG, experts_impl="dense_train", attn_impl="sdpa").to(device)
    model.train()
    common.set_qat(model, not args.no_qat)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params:,} parameters ({2 * n_params / 1e6:.2f} MB in bf16), device {device}")

    opt = optimizer(model, args, device)
    loads, routers = router_loads(model)

    gen = torch.Generator().manual_seed(args.seed)
    order = torch.randperm(len(train_w), generator=gen)
    pos = 0
    epoch = 0
    total_steps = args.steps or args.max_steps
    calibrated = bool(args.steps)
    history = []
    best = (math.inf, -1, None)
    bad_evals = 0
    stop_reason = "max_steps"
    t_train = time.time()
    t_calib = None
    step = 0
    seen_tokens = 0
    while step < total_steps:
        if pos + args.batch > len(order):
            order = torch.randperm(len(train_w), generator=gen)
            pos = 0
            epoch += 1
        batch = train_w[order[pos:pos + args.batch]].to(device, dtype=torch.long, non_blocking=True)
        pos += args.batch
        lr = common.lr_at(step, total_steps, args.lr, args.warmup, args.min_lr_frac)
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_autocast):
            logits = model(input_ids=batch[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            for n, r in routers.items():
                cnt = torch.bincount(loads[n].reshape(-1), minlength=r.num_experts).float()
                r.e_score_correction_bias += args.bias_rate * torch.sign(cnt.mean() - cnt)
        step += 1
        seen_tokens += batch[:, 1:].numel()

        if step == 20:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t_calib = time.time()
        if step == 70 and not calibrated:
            if device.type == "cuda":
                torch.cuda.synchronize()
            per_step = (time.time() - t_calib) / 50
            t_eval = time.time()
            eval_loss(model, held_w, device, args.batch, use_autocast)
            eval_cost = time.time() - t_eval
            remaining = args.time_budget - (time.time() - t_train)
            fit = int(0.97 * remaining / (per_step + eval_cost / args.eval_every))
            total_steps = max(step + 1, min(args.max_steps, step + fit))
            calibrated = True
            log(f"calibration: {per_step * 1000:.1f} ms/step, {eval_cost:.2f} s/evaluation -> schedule of "
                f"{total_steps} steps")
        if step % 50 == 0 or step == 1:
            log(f"step {step}/{total_steps} epoch {epoch} loss {loss.item():.4f} lr {lr:.2e} gnorm {gnorm:.2f} "
                f"tok/s {seen_tokens / (time.time() - t_train):,.0f}")
        last = step >= total_steps
        over_time = time.time() - t_train > args.time_budget
        if step % args.eval_every == 0 or last or over_time:
            hl = eval_loss(model, held_w, device, args.batch, use_autocast)
            bias_abs = max(r.e_score_correction_bias.abs().max().item() for r in routers.values())
            history.append({"step": step, "heldout_loss": hl, "train_loss": loss.item(),
                            "seconds": time.time() - t_train, "max_abs_bias": bias_abs})
            log(f"eval step {step}: held-out loss {hl:.4f} (best {min(best[0], hl):.4f}) max|bias| {bias_abs:.4f}")
            if hl < best[0] - 1e-4:
                best = (hl, step, {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})
                bad_evals = 0
            else:
                bad_evals += 1
                if bad_evals >= args.patience:
                    stop_reason = f"early stop: no held-out improvement in {args.patience} evaluations"
                    break
        if over_time and not last:
            stop_reason = "time budget"
            break
    train_seconds = time.time() - t_train
    log(f"training stopped at step {step} ({stop_reason}); best held-out loss {best[0]:.4f} at step {best[1]}")

    exported = export(model, best[2], args)

    # ---- check the saved file and evaluate it in float32 ----------------------------------------------
    st, shapes = check_saved(args.out, exported, model.config)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    ref = common.load_hf(args.out, dtype=torch.float32, experts_impl="eager", attn_impl="sdpa").to(device)
    final = eval_loss(ref, held_w_all, device, args.batch, autocast=False)
    log(f"saved checkpoint, float32: held-out loss {final:.4f}, perplexity {math.exp(final):.2f} "
        f"over {held_w_all[:, 1:].numel():,} tokens")
    held_bytes = sum(len(d["text"].encode()) for d in held_docs)
    metrics = {
        "heldout_loss": final,
        "heldout_perplexity": math.exp(final),
        "heldout_tokens": int(held_w_all[:, 1:].numel()),
        "heldout_bits_per_byte_approx": final / math.log(2) * len(held_stream) / held_bytes,
        "heldout_loss_training_eval_best": best[0],
        "best_step": best[1],
        "steps": step,
        "schedule_steps": total_steps,
        "stop_reason": stop_reason,
        "train_seconds": train_seconds,
        "total_seconds": time.time() - t_start,
        "train_tokens_seen": seen_tokens,
        "train_stream_tokens": len(train_stream),
        "epochs": epoch + pos / max(1, len(order)),
        "params": n_params,
        "model_safetensors_bytes": st.stat().st_size,
        "model_safetensors_sha256": common.sha256_file(st),
        "tensor_shapes": shapes,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "history": history,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
    }
    mpath = args.metrics or args.out.parent / "target-metrics.json"
    mpath.write_text(json.dumps(metrics, indent=1) + "\n")
    log(f"wrote {args.out} ({st.stat().st_size:,} bytes) and {mpath}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
