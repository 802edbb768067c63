//! Layer weights in f32 and their per-row forward: linear, SwiGLU MLP, gated attention, MoE.
//! Every function here computes one row at a time with a fixed order of operations, so a row's
//! result never depends on how many rows share a forward (batch invariance).

use fastdecode_model::rope::Rope;

use crate::kv_cache::LayerKv;

use crate::ops::{matvec, rms_norm, sigmoid, silu, softmax_exp, softplus};

/// A bias-free linear layer, `W` is `[out, in]`.
pub struct Linear {
    pub w: Vec<f32>,
    pub out: usize,
    pub inp: usize,
}

impl Linear {
    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        let mut y = vec![0f32; self.out];
        matvec(&self.w, x, &mut y);
        y
    }
}

/// `down(silu(gate(x)) · up(x))`.
pub struct Mlp {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

impl Mlp {
    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        let g = self.gate.forward(x);
        let u = self.up.forward(x);
        let a: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| silu(g) * u).collect();
        self.down.forward(&a)
    }
}

/// Gated multi-head attention with q/k RMSNorm, partial RoPE and GQA.
pub struct Attention {
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub g: Linear,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rope: Rope,
    /// A query at position p sees keys p-window+1 ..= p; `None` = full causal attention.
    pub window: Option<usize>,
}

/// Per-row projections before attention: q rotated, k normed and rotated, v, and the gate.
pub struct Projected {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub gate: Vec<f32>,
}

impl Attention {
    /// Normalise each head of `x` with `w` and rotate it at `pos`.
    pub fn norm_rope_heads(&self, x: &mut [f32], w: &[f32], eps: f32, pos: usize) {
        let d = self.head_dim;
        let half = self.rope.rotary_dim / 2;
        let (mut cos, mut sin) = (vec![0f32; half], vec![0f32; half]);
        self.rope.cos_sin(pos, &mut cos, &mut sin);
        let mut tmp = vec![0f32; d];
        for head in x.chunks_exact_mut(d) {
            rms_norm(head, w, eps, &mut tmp);
            head.copy_from_slice(&tmp);
            self.rope.apply(head, &cos, &sin);
        }
    }

    /// q, k, v and the softplus gate of one normed row at absolute position `pos`.
    pub fn project(&self, xn: &[f32], pos: usize, eps: f32) -> Projected {
        let mut q = self.q.forward(xn);
        let mut k = self.k.forward(xn);
        self.norm_rope_heads(&mut q, &self.q_norm, eps, pos);
        self.norm_rope_heads(&mut k, &self.k_norm, eps, pos);
        let gate = self.g.forward(xn).into_iter().map(softplus).collect();
        Projected {
            q,
            k,
            v: self.v.forward(xn),
            gate,
        }
    }

    /// Context keys/values (drafter): k normed and rotated at `pos`, v.
    pub fn project_kv(&self, xn: &[f32], pos: usize, eps: f32) -> (Vec<f32>, Vec<f32>) {
        let mut k = self.k.forward(xn);
        self.norm_rope_heads(&mut k, &self.k_norm, eps, pos);
        (k, self.v.forward(xn))
    }

    /// Projections of consecutive rows `x` at positions `p0..`, each normed with `norm` first.
    pub fn project_rows(
        &self,
        x: &[Vec<f32>],
        norm: &[f32],
        p0: usize,
        eps: f32,
    ) -> Vec<Projected> {
        x.iter()
            .enumerate()
            .map(|(j, row)| self.project(&normed(row, norm, eps), p0 + j, eps))
            .collect()
    }

    /// Adds to each residual row `x[j]` (position `p0 + j`) its attention output over the keys it
    /// sees: positions before `p0` from `cache`, then this block's own rows, in position order.
    pub fn attend_block(&self, proj: &[Projected], p0: usize, cache: &LayerKv, x: &mut [Vec<f32>]) {
        for (j, p) in proj.iter().enumerate() {
            let pos = p0 + j;
            let keys: Vec<(&[f32], &[f32])> = (self.first_visible(pos)..=pos)
                .map(|q| {
                    if q >= p0 {
                        (proj[q - p0].k.as_slice(), proj[q - p0].v.as_slice())
                    } else {
                        (cache.key(q), cache.value(q))
                    }
                })
                .collect();
            for (a, b) in x[j].iter_mut().zip(self.attend(p, &keys)) {
                *a += b;
            }
        }
    }

    /// First key position a query at `pos` sees.
    pub fn first_visible(&self, pos: usize) -> usize {
        match self.window {
            Some(w) => (pos + 1).saturating_sub(w),
            None => 0,
        }
    }

    /// Attention of one projected row over `keys` (ascending positions, each `(k, v)` of all kv
    /// heads), then the per-head gate and o_proj. Scores, softmax and the weighted sum run in
    /// position order.
    pub fn attend<'a>(&self, p: &Projected, keys: &[(&'a [f32], &'a [f32])]) -> Vec<f32> {
        let d = self.head_dim;
        let group = self.heads / self.kv_heads;
        let scale = 1.0 / (d as f32).sqrt();
        let mut out = vec![0f32; self.heads * d];
        let mut scores = vec![0f32; keys.len()];
        for h in 0..self.heads {
            let kvh = h / group;
            let q = &p.q[h * d..(h + 1) * d];
            let mut max = f32::NEG_INFINITY;
            for (s, (k, _)) in scores.iter_mut().zip(keys) {
                let k = &k[kvh * d..(kvh + 1) * d];
                let mut dot = 0f32;
                for i in 0..d {
                    dot += q[i] * k[i];
                }
                *s = dot * scale;
                max = max.max(*s);
            }
            let mut sum = 0f32;
            for s in scores.iter_mut() {
                *s = softmax_exp(*s - max);
                sum += *s;
            }
            let o = &mut out[h * d..(h + 1) * d];
            for (s, (_, v)) in scores.iter().zip(keys) {
                let w = s / sum;
                let v = &v[kvh * d..(kvh + 1) * d];
                for i in 0..d {
                    o[i] += w * v[i];
                }
            }
            for x in o.iter_mut() {
                *x *= p.gate[h];
            }
        }
        self.o.forward(&out)
    }
}

/// Sigmoid-routed mixture of experts with a shared expert.
pub struct Moe {
    pub router: Linear,
    pub bias: Vec<f32>,
    pub experts: Vec<Mlp>,
    pub shared: Mlp,
    pub top_k: usize,
    pub routed_scaling: f32,
    pub norm_topk: bool,
    /// 0 = off; else logits = c·tanh(logits/c) before the sigmoid.
    pub softcap: f32,
}

impl Moe {
    /// The selected experts (ascending index) and their weights.
    ///
    /// Selection: top-k of `sigmoid(logit) + bias`, exact ties broken by the lower expert index.
    /// Weights: the pre-bias scores of the selected experts, renormalised to sum 1 when
    /// `norm_topk`. Returned in ascending expert order, which is also the summation order of the
    /// routed sum (the order HF transformers accumulates experts in).
    pub fn route(&self, x: &[f32]) -> Vec<(usize, f32)> {
        let logits = self.router.forward(x);
        let scores: Vec<f32> = logits
            .iter()
            .map(|&l| {
                let l = if self.softcap > 0.0 {
                    self.softcap * (l / self.softcap).tanh()
                } else {
                    l
                };
                sigmoid(l)
            })
            .collect();
        let mut order: Vec<usize> = (0..scores.len()).collect();
        let key = |e: usize| scores[e] + self.bias[e];
        order.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
        let mut chosen: Vec<usize> = order[..self.top_k].to_vec();
        chosen.sort_unstable();
        let mut total = 0f32;
        for &e in &chosen {
            total += scores[e];
        }
        chosen
            .into_iter()
            .map(|e| {
                let w = if self.norm_topk {
                    scores[e] / total
                } else {
                    scores[e]
                };
                (e, w)
            })
            .collect()
    }

    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        let mut routed = vec![0f32; x.len()];
        for (e, w) in self.route(x) {
            let y = self.experts[e].forward(x);
            for (r, y) in routed.iter_mut().zip(y) {
                *r += w * y;
            }
        }
        let shared = self.shared.forward(x);
        routed
            .iter()
            .zip(shared)
            .map(|(&r, s)| self.routed_scaling * r + s)
            .collect()
    }
}

/// Feed-forward block of one decoder layer.
pub enum Ffn {
    Dense(Mlp),
    Moe(Box<Moe>),
}

impl Ffn {
    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        match self {
            Ffn::Dense(m) => m.forward(x),
            Ffn::Moe(m) => m.forward(x),
        }
    }
}

/// RMSNorm of a row into a new vector.
pub fn normed(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    rms_norm(x, w, eps, &mut out);
    out
}
