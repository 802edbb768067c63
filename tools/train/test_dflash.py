"""Checks the batched DFlash drafter forward (dflash.py, many anchors per sequence in one masked attention)
against a naive per-row implementation written straight from docs/spec/dflash.md. Run: python3 -m pytest
tools/train/test_dflash.py (or python3 tools/train/test_dflash.py)."""
from __future__ import annotations

import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dflash  # noqa: E402
import testing  # noqa: E402

CFG = {
    "hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 48, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 8, "rms_norm_eps": 1e-6, "rope_theta": 500000.0,
    "sliding_window": 6, "dflash_config": {"target_layer_ids": [0, 2], "mask_token_id": 3},
}


def rms(x, w, eps=1e-6):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def rope(x, pos, theta):
    """x [hd] at integer position pos; pairs (j, j + hd/2)."""
    hd = x.shape[-1]
    out = x.clone()
    for j in range(hd // 2):
        ang = pos * theta ** (-2 * j / hd)
        c, s = math.cos(ang), math.sin(ang)
        out[j] = x[j] * c - x[j + hd // 2] * s
        out[j + hd // 2] = x[j + hd // 2] * c + x[j] * s
    return out


def naive_block(d: dflash.DFlashDrafter, embed, taps, tokens, o, k, mask_id, window):
    """One drafting round at bonus position o: context rows 0..o-1, block [tokens[o], mask...]."""
    sd = {n: p.detach().double() for n, p in d.state_dict().items()}
    hd, h_n, kv_n = CFG["head_dim"], CFG["num_attention_heads"], CFG["num_key_value_heads"]
    theta = CFG["rope_theta"]
    t = len(CFG["dflash_config"]["target_layer_ids"])
    ctx = []
    for q in range(o):
        parts = [rms(taps[q, j].double(), sd[f"aux_hidden_norms.{j}.weight"]) for j in range(t)]
        ctx.append(rms(sd["fc.weight"] @ torch.cat(parts), sd["hidden_norm.weight"]))
    block = [tokens[o].item()] + [mask_id] * (k - 1)
    h = [embed[b].double() for b in block]
    for li in range(CFG["num_hidden_layers"]):
        p = f"layers.{li}."
        ln = sd[p + "input_layernorm.weight"]

        def kvs(x, pos):
            kk = (sd[p + "self_attn.k_proj.weight"] @ x).view(kv_n, hd)
            vv = (sd[p + "self_attn.v_proj.weight"] @ x).view(kv_n, hd)
            kk = torch.stack([rope(rms(kk[i], sd[p + "self_attn.k_norm.weight"]), pos, theta) for i in range(kv_n)])
            return kk, vv

        ck = [kvs(rms(c, ln), q) for q, c in enumerate(ctx)]
        xs = [rms(x, ln) for x in h]
        bk = [kvs(xn, o + j) for j, xn in enumerate(xs)]
        new_h = []
        for j, xn in enumerate(xs):
            pos = o + j
            qh = (sd[p + "self_attn.q_proj.weight"] @ xn).view(h_n, hd)
            gate = F.softplus(sd[p + "self_attn.g_proj.weight"] @ xn)
            keys = [(ck[q], q) for q in range(o) if q > pos - window] + [(bk[jj], o + jj) for jj in range(j + 1)]
            heads = []
            for hh in range(h_n):
                g = hh // (h_n // kv_n)
                qv = rope(rms(qh[hh], sd[p + "self_attn.q_norm.weight"]), pos, theta)
                sc = torch.stack([(qv @ kvp[0][g]) * hd ** -0.5 for kvp, _ in keys])
                w = torch.softmax(sc, 0)
                heads.append(gate[hh] * sum(w[i] * keys[i][0][1][g] for i in range(len(keys))))
            x = h[j] + sd[p + "self_attn.o_proj.weight"] @ torch.cat(heads)
            hn = rms(x, sd[p + "post_attention_layernorm.weight"])
            m = sd[p + "mlp.down_proj.weight"] @ (F.silu(sd[p + "mlp.gate_proj.weight"] @ hn)
                                                 * (sd[p + "mlp.up_proj.weight"] @ hn))
            new_h.append(x + m)
        h = new_h
    return torch.stack([rms(x, sd["norm.weight"]) for x in h])


def test_batched_matches_naive():
    torch.manual_seed(0)
    d = dflash.DFlashDrafter(CFG).double()
    with torch.no_grad():
        for n, p in d.named_parameters():
            if p.ndim == 1:
                p.copy_(1 + 0.3 * torch.randn_like(p))
            else:
                p.normal_(0, 0.3)
    v, length, k = 50, 20, 5
    embed = torch.randn(v, CFG["hidden_size"], dtype=torch.float64)
    taps = torch.randn(1, length, 2, CFG["hidden_size"], dtype=torch.float64)
    tokens = torch.randint(4, v, (1, length))
    anchors = torch.tensor([[3, 9, 15, 1]])
    ctx = d.context(taps)
    emb_mod = torch.nn.Embedding.from_pretrained(embed)
    # RoPE angles are computed in float32 (as transformers does), hence the 1e-5 tolerance
    ident = lambda x: x  # noqa: E731  (compare hidden states, not logits)
    out = dflash.drafter_logits(d, emb_mod, ident, tokens, ctx, anchors, k, 3, CFG["sliding_window"])
    for ai, o in enumerate(anchors[0].tolist()):
        ref = naive_block(d, embed, taps[0], tokens[0], o, k, 3, CFG["sliding_window"])
        assert torch.allclose(out[0, ai], ref, atol=1e-5, rtol=1e-5), (o, (out[0, ai] - ref).abs().max())


if __name__ == "__main__":
    testing.run_all(globals())
