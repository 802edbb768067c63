"""The DFlash drafter (docs/spec/dflash.md) in PyTorch.

Tensor names (the module's state_dict) are exactly the spec's:
  fc.weight [D, T*D], hidden_norm.weight, norm.weight, aux_hidden_norms.{j}.weight (j < T),
  layers.{i}.input_layernorm.weight, layers.{i}.post_attention_layernorm.weight,
  layers.{i}.self_attn.{q_proj,k_proj,v_proj,o_proj,g_proj}.weight, layers.{i}.self_attn.{q_norm,k_norm}.weight,
  layers.{i}.mlp.{gate_proj,up_proj,down_proj}.weight.
The drafter has no embedding or lm_head: it borrows the target's `model.embed_tokens` and `lm_head`.

Semantics (one forward handles A anchors per sequence at once; A = 1 is one drafting round):
  context  c = RMSNorm( concat_j RMSNorm(hidden_j; aux_hidden_norms[j]) . fc^T ; hidden_norm ), where hidden_j is
           the output of target decoder layer target_layer_ids[j] (after its residual add, before the final norm),
           one row per committed position.
  layer    xn = RMSNorm(h; input_layernorm); q, k, v from xn, with per-head q_norm / k_norm (weight [head_dim]);
           context keys/values from cn = RMSNorm(c; input_layernorm) with the same k_proj / k_norm / v_proj;
           RoPE (default, all head_dim dims, rotate-half pairs (j, j + head_dim/2), theta = rope_theta) at absolute
           positions, for block rows and context rows alike; scale head_dim^-0.5; GQA (query head h uses kv head
           h // (H / KV)); a block row at position p sees context rows at positions q with p - W < q < O (W = the
           sliding window, O = the bonus position) and the rows of its own block at or before it;
           gate g = softplus(xn . g_proj^T) in float32, one per head, multiplies that head's attention output;
           h += o_proj(gated); h += down(silu(gate(hn)) * up(hn)) with hn = RMSNorm(h; post_attention_layernorm).
  output   logits = target.lm_head( RMSNorm(h; norm) ); drafts d_j = argmax of row j, j = 1 .. K-1.
Block input = [bonus, mask, ..., mask] at positions O .. O+K-1, embedded with the target's embed_tokens.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Same arithmetic as transformers' LagunaRMSNorm."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def rope_cos_sin(pos: torch.Tensor, head_dim: int, theta: float):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=pos.device) / head_dim))
    freqs = pos.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x, cos, sin):
    """x [B, H, L, hd]; cos, sin [B, L, hd]."""
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        d, hd = cfg["hidden_size"], cfg["head_dim"]
        self.h, self.kv, self.hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], hd
        self.q_proj = nn.Linear(d, self.h * hd, bias=False)
        self.k_proj = nn.Linear(d, self.kv * hd, bias=False)
        self.v_proj = nn.Linear(d, self.kv * hd, bias=False)
        self.o_proj = nn.Linear(self.h * hd, d, bias=False)
        self.g_proj = nn.Linear(d, self.h, bias=False)  # per-head gate
        self.q_norm = RMSNorm(hd, cfg["rms_norm_eps"])
        self.k_norm = RMSNorm(hd, cfg["rms_norm_eps"])

    def kv_of(self, xn, cos, sin):
        b, l, _ = xn.shape
        k = self.k_norm(self.k_proj(xn).view(b, l, self.kv, self.hd)).transpose(1, 2)
        v = self.v_proj(xn).view(b, l, self.kv, self.hd).transpose(1, 2)
        return apply_rope(k, cos, sin), v

    def forward(self, xn, cn, q_cs, c_cs, mask):
        b, q_len, _ = xn.shape
        q = self.q_norm(self.q_proj(xn).view(b, q_len, self.h, self.hd)).transpose(1, 2)
        q = apply_rope(q, *q_cs)
        kb, vb = self.kv_of(xn, *q_cs)
        kc, vc = self.kv_of(cn, *c_cs)
        k = torch.cat([kc, kb], dim=2)
        v = torch.cat([vc, vb], dim=2)
        rep = self.h // self.kv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        q, k = q.to(v.dtype), k.to(v.dtype)  # under autocast the q/k norms return float32
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], scale=self.hd ** -0.5)
        o = o.transpose(1, 2)  # [B, Q, H, hd]
        gate = F.softplus(self.g_proj(xn).float()).to(o.dtype)
        o = (o * gate[..., None]).reshape(b, q_len, self.h * self.hd)
        return self.o_proj(o)


class MLP(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        d, i = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = nn.Linear(d, i, bias=False)
        self.up_proj = nn.Linear(d, i, bias=False)
        self.down_proj = nn.Linear(i, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.mlp = MLP(cfg)

    def forward(self, h, c, q_cs, c_cs, mask):
        xn = self.input_layernorm(h)
        cn = self.input_layernorm(c)
        h = h + self.self_attn(xn, cn, q_cs, c_cs, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDrafter(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.cfg = cfg
        d = cfg["hidden_size"]
        t = len(cfg["dflash_config"]["target_layer_ids"])
        eps = cfg["rms_norm_eps"]
        self.fc = nn.Linear(t * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, eps)
        self.aux_hidden_norms = nn.ModuleList([RMSNorm(d, eps) for _ in range(t)])
        self.layers = nn.ModuleList([Layer(cfg) for _ in range(cfg["num_hidden_layers"])])
        self.norm = RMSNorm(d, eps)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)

    def context(self, taps: torch.Tensor) -> torch.Tensor:
        """taps [B, L, T, D] (target hidden states at the tapped layers) -> context rows c [B, L, D]."""
        parts = [n(taps[..., j, :]) for j, n in enumerate(self.aux_hidden_norms)]
        return self.hidden_norm(self.fc(torch.cat(parts, dim=-1)))

    def forward(self, block_emb, q_pos, ctx, ctx_pos, mask):
        """block_emb [B, Q, D] at positions q_pos [B, Q]; ctx [B, L, D] at ctx_pos [B, L];
        mask [B, Q, L + Q] bool (True = may attend; context keys first, then block keys).
        Returns RMSNorm(h; norm) [B, Q, D] (apply the target's lm_head for logits)."""
        hd, theta = self.cfg["head_dim"], self.cfg["rope_theta"]
        q_cs = rope_cos_sin(q_pos, hd, theta)
        c_cs = rope_cos_sin(ctx_pos, hd, theta)
        h = block_emb
        for layer in self.layers:
            h = layer(h, ctx, q_cs, c_cs, mask)
        return self.norm(h)


def block_mask(anchors: torch.Tensor, ctx_len: int, k: int, window: int) -> torch.Tensor:
    """anchors [B, A] (bonus positions O); context rows at positions 0 .. ctx_len-1; blocks of k rows.
    Returns mask [B, A*k, ctx_len + A*k]: row (a, j) at p = O_a + j sees context q with p - window < q < O_a and
    block rows (a, j') with j' <= j."""
    b, a = anchors.shape
    dev = anchors.device
    j = torch.arange(k, device=dev)
    p = (anchors[:, :, None] + j).reshape(b, a * k)  # [B, Q]
    o = anchors[:, :, None].expand(b, a, k).reshape(b, a * k)
    cpos = torch.arange(ctx_len, device=dev)
    ctx_ok = (cpos[None, None, :] < o[:, :, None]) & (cpos[None, None, :] > p[:, :, None] - window)
    qa = torch.arange(a, device=dev).repeat_interleave(k)
    qj = j.repeat(a)
    blk_ok = (qa[:, None] == qa[None, :]) & (qj[None, :] <= qj[:, None])
    return torch.cat([ctx_ok, blk_ok[None].expand(b, -1, -1)], dim=-1)


def drafter_logits(drafter, embed, lm_head, tokens, ctx, anchors, k, mask_id, window):
    """Run the drafter on blocks at `anchors` [B, A] of `tokens` [B, L] (bonus = tokens[O]) with context rows
    ctx [B, L, D] (only rows before each anchor are visible). Returns logits [B, A, k, V]."""
    b, a = anchors.shape
    l = ctx.shape[1]
    block = torch.full((b, a, k), mask_id, dtype=torch.long, device=tokens.device)
    block[:, :, 0] = tokens.gather(1, anchors)
    emb = embed(block.reshape(b, a * k)).to(ctx.dtype)
    q_pos = (anchors[:, :, None] + torch.arange(k, device=tokens.device)).reshape(b, a * k)
    ctx_pos = torch.arange(l, device=tokens.device)[None].expand(b, l)
    mask = block_mask(anchors, l, k, window)
    h = drafter(emb, q_pos, ctx, ctx_pos, mask)
    return lm_head(h).view(b, a, k, -1)
