//! The GPU target session: KV cache (full layers hold `max_positions`; sliding layers a ring of
//! window + chunk slots) and the forward entry point.

use std::sync::Arc;

use cudarc::driver::CudaSlice;

use fastdecode_cpu::ForwardOut;

use crate::error::{CudaError, Result};
use crate::model::{CudaModel, DevFfn};

/// Scratch activations for one chunk of rows, allocated once.
struct Scratch {
    x: CudaSlice<f32>,
    xn: CudaSlice<f32>,
    q: CudaSlice<f32>,
    k: CudaSlice<f32>,
    v: CudaSlice<f32>,
    g: CudaSlice<f32>,
    att: CudaSlice<f32>,
    a: CudaSlice<f32>,
    b: CudaSlice<f32>,
    rl: CudaSlice<f32>,
    ids: CudaSlice<i32>,
    wts: CudaSlice<f32>,
    h: CudaSlice<f32>,
    hs: CudaSlice<f32>,
    logits: CudaSlice<f32>,
}

pub struct CudaTarget {
    pub model: Arc<CudaModel>,
    kv: Vec<(CudaSlice<f32>, CudaSlice<f32>)>,
    len: usize,
    chunk: usize,
    max_positions: usize,
    s: Scratch,
    /// When set, every op is bracketed by CUDA events (`fastdecode bench --profile`).
    pub profiler: Option<crate::profile::Profiler>,
}

impl CudaTarget {
    /// A session for verify blocks of up to `max_block` rows and contexts of up to `max_positions`.
    pub fn new(model: Arc<CudaModel>, max_block: usize, max_positions: usize) -> Result<Self> {
        let c = &model.cfg;
        let st = &model.gpu.stream;
        let chunk = max_block.max(16);
        let kvd = c.num_key_value_heads * c.head_dim;
        let mut kv = vec![];
        for l in &model.layers {
            let slots = if l.window > 0 {
                l.window + chunk
            } else {
                max_positions
            };
            kv.push((
                st.alloc_zeros::<f32>(slots * kvd)?,
                st.alloc_zeros::<f32>(slots * kvd)?,
            ));
        }
        let hmax = c
            .num_attention_heads_per_layer
            .iter()
            .copied()
            .max()
            .unwrap_or(1);
        let k = c.num_experts_per_tok.max(1);
        let (h, d, n) = (c.hidden_size, c.head_dim, chunk);
        let s = Scratch {
            x: st.alloc_zeros(n * h)?,
            xn: st.alloc_zeros(n * h)?,
            q: st.alloc_zeros(n * hmax * d)?,
            k: st.alloc_zeros(n * kvd)?,
            v: st.alloc_zeros(n * kvd)?,
            g: st.alloc_zeros(n * hmax)?,
            att: st.alloc_zeros(n * hmax * d)?,
            a: st.alloc_zeros(n * c.intermediate_size.max(1))?,
            b: st.alloc_zeros(n * c.intermediate_size.max(1))?,
            rl: st.alloc_zeros(n * c.num_experts.max(1))?,
            ids: st.alloc_zeros(n * k)?,
            wts: st.alloc_zeros(n * k)?,
            h: st.alloc_zeros(n * k * c.moe_intermediate_size.max(1))?,
            hs: st.alloc_zeros(n * c.shared_expert_intermediate_size.max(1))?,
            logits: st.alloc_zeros(n * c.vocab_size)?,
        };
        Ok(CudaTarget {
            model,
            kv,
            len: 0,
            chunk,
            max_positions,
            s,
            profiler: None,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn truncate(&mut self, len: usize) {
        assert!(len <= self.len, "truncate can only shrink the cache");
        self.len = len;
    }

    pub fn reset(&mut self) {
        self.len = 0;
    }

    pub fn forward(
        &mut self,
        tokens: &[u32],
        positions: &[usize],
        taps: &[usize],
    ) -> Result<ForwardOut> {
        let c = self.model.cfg.clone();
        let p0 = self.len;
        if positions.len() != tokens.len()
            || positions.iter().enumerate().any(|(i, &p)| p != p0 + i)
        {
            return Err(CudaError::Shape(format!(
                "forward: positions {positions:?} do not continue the KV cache of length {p0}"
            )));
        }
        if p0 + tokens.len() > self.max_positions {
            return Err(CudaError::Shape(format!(
                "forward: context {} exceeds this session's {} positions",
                p0 + tokens.len(),
                self.max_positions
            )));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(CudaError::Shape(format!(
                "forward: token id {t} is outside the vocabulary (0..{})",
                c.vocab_size
            )));
        }
        if let Some(&l) = taps.iter().find(|&&l| l >= c.num_hidden_layers) {
            return Err(CudaError::Shape(format!(
                "forward: tap layer {l} is out of range 0..{}",
                c.num_hidden_layers
            )));
        }
        let mut out = ForwardOut {
            logits: Vec::with_capacity(tokens.len() * c.vocab_size),
            taps: vec![],
        };
        for start in (0..tokens.len()).step_by(self.chunk) {
            let end = (start + self.chunk).min(tokens.len());
            self.forward_chunk(&tokens[start..end], p0 + start, taps, &mut out)?;
        }
        Ok(out)
    }

    fn forward_chunk(
        &mut self,
        tokens: &[u32],
        p0: usize,
        taps: &[usize],
        out: &mut ForwardOut,
    ) -> Result<()> {
        let m = self.model.clone();
        let c = &m.cfg;
        let g = m.gpu.as_ref();
        let st = &g.stream;
        let n = tokens.len();
        let (h, d, kvh) = (c.hidden_size, c.head_dim, c.num_key_value_heads);
        let kvd = kvh * d;
        let eps = c.rms_norm_eps as f32;
        let toks: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let pos: Vec<i32> = (p0..p0 + n).map(|p| p as i32).collect();
        let dtok = st.clone_htod(&toks)?;
        let dpos = st.clone_htod(&pos)?;
        let mut prof = self.profiler.take();
        macro_rules! mark {
            ($name:expr) => {
                if let Some(p) = prof.as_mut() {
                    p.mark($name, st)?;
                }
            };
        }
        mark!("start");
        let s = &mut self.s;
        g.embed_rows(&m.embed, &dtok, &mut s.x, h)?;
        mark!("embed_rows");
        let mut tap_rows = vec![vec![0f32; 0]; taps.len()];
        for (li, l) in m.layers.iter().enumerate() {
            let nh = l.heads;
            g.rms_norm_rows(
                &s.x.as_view(),
                &l.input_norm.as_view(),
                &mut s.xn.as_view_mut(),
                h,
                n,
                eps,
            )?;
            mark!("rms_norm");
            g.gemv_bf16(
                &l.q.as_view(),
                &s.xn.as_view(),
                &mut s.q.as_view_mut(),
                nh * d,
                h,
                n,
                false,
            )?;
            mark!("gemv q_proj");
            g.gemv_bf16(
                &l.k.as_view(),
                &s.xn.as_view(),
                &mut s.k.as_view_mut(),
                kvd,
                h,
                n,
                false,
            )?;
            mark!("gemv k_proj");
            g.gemv_bf16(
                &l.v.as_view(),
                &s.xn.as_view(),
                &mut s.v.as_view_mut(),
                kvd,
                h,
                n,
                false,
            )?;
            mark!("gemv v_proj");
            g.gemv_bf16(
                &l.g.as_view(),
                &s.xn.as_view(),
                &mut s.g.as_view_mut(),
                nh,
                h,
                n,
                false,
            )?;
            mark!("gemv g_proj");
            g.qk_norm_rope(
                &mut s.q.as_view_mut(),
                &l.q_norm,
                &dpos.as_view(),
                &l.rope,
                nh,
                d,
                n,
                eps,
            )?;
            mark!("qk_norm_rope");
            g.qk_norm_rope(
                &mut s.k.as_view_mut(),
                &l.k_norm,
                &dpos.as_view(),
                &l.rope,
                kvh,
                d,
                n,
                eps,
            )?;
            mark!("qk_norm_rope");
            let ring = if l.window > 0 {
                l.window + self.chunk
            } else {
                0
            };
            let (ck, cv) = &mut self.kv[li];
            g.kv_store(
                &s.k.as_view(),
                &s.v.as_view(),
                ck,
                cv,
                &dpos.as_view(),
                ring,
                kvd,
                n,
            )?;
            mark!("kv_store");
            let max_keys = if l.window > 0 { l.window } else { p0 + n };
            g.attend(
                &s.q.as_view(),
                ck,
                cv,
                &s.g.as_view(),
                &dpos.as_view(),
                &mut s.att.as_view_mut(),
                nh,
                kvh,
                d,
                l.window,
                ring,
                n,
                max_keys,
            )?;
            mark!("attend");
            g.gemv_bf16(
                &l.o.as_view(),
                &s.att.as_view(),
                &mut s.x.as_view_mut(),
                h,
                nh * d,
                n,
                true,
            )?;
            mark!("gemv o_proj (+residual)");
            g.rms_norm_rows(
                &s.x.as_view(),
                &l.post_norm.as_view(),
                &mut s.xn.as_view_mut(),
                h,
                n,
                eps,
            )?;
            mark!("rms_norm");
            match &l.ffn {
                DevFfn::Dense { gate, up, down } => {
                    let w = c.intermediate_size;
                    g.gemv_bf16(
                        &gate.as_view(),
                        &s.xn.as_view(),
                        &mut s.a.as_view_mut(),
                        w,
                        h,
                        n,
                        false,
                    )?;
                    mark!("dense gate");
                    g.gemv_bf16(
                        &up.as_view(),
                        &s.xn.as_view(),
                        &mut s.b.as_view_mut(),
                        w,
                        h,
                        n,
                        false,
                    )?;
                    mark!("dense up");
                    let (av, bv) = (s.a.as_view(), s.b.as_view());
                    let mut act = st.alloc_zeros::<f32>(n * w)?;
                    g.silu_mul(&av, &bv, &mut act.as_view_mut(), n * w)?;
                    mark!("silu_mul");
                    g.gemv_bf16(
                        &down.as_view(),
                        &act.as_view(),
                        &mut s.x.as_view_mut(),
                        h,
                        w,
                        n,
                        true,
                    )?;
                    mark!("dense down (+residual)");
                }
                DevFfn::Moe(e) => {
                    let (ne, k, mi, si) = (
                        c.num_experts,
                        c.num_experts_per_tok,
                        c.moe_intermediate_size,
                        c.shared_expert_intermediate_size,
                    );
                    g.gemv_bf16(
                        &e.router.as_view(),
                        &s.xn.as_view(),
                        &mut s.rl.as_view_mut(),
                        ne,
                        h,
                        n,
                        false,
                    )?;
                    mark!("gemv router");
                    g.router_topk(
                        &s.rl.as_view(),
                        &e.bias,
                        &mut s.ids.as_view_mut(),
                        &mut s.wts.as_view_mut(),
                        ne,
                        k,
                        c.norm_topk_prob,
                        c.moe_router_logit_softcapping as f32,
                        n,
                    )?;
                    mark!("router_topk");
                    g.nvfp4_gate_up(
                        &e.gate,
                        &e.up,
                        &s.xn.as_view(),
                        Some(&s.ids.as_view()),
                        &mut s.h.as_view_mut(),
                        mi,
                        h,
                        n,
                        k,
                    )?;
                    mark!("nvfp4 gate_up (routed)");
                    g.nvfp4_gate_up(
                        &e.shared_gate,
                        &e.shared_up,
                        &s.xn.as_view(),
                        None,
                        &mut s.hs.as_view_mut(),
                        si,
                        h,
                        n,
                        1,
                    )?;
                    mark!("nvfp4 gate_up (shared)");
                    g.nvfp4_down_combine(
                        &e.down,
                        &e.shared_down,
                        &s.h.as_view(),
                        &s.hs.as_view(),
                        &s.ids.as_view(),
                        &s.wts.as_view(),
                        &mut s.x.as_view_mut(),
                        h,
                        mi,
                        si,
                        k,
                        c.moe_routed_scaling_factor as f32,
                        n,
                    )?;
                    mark!("nvfp4 down+combine+shared+residual");
                }
            }
            for (t, _) in taps.iter().enumerate().filter(|(_, &tl)| tl == li) {
                tap_rows[t] = st.clone_dtoh(&s.x.slice(0..n * h))?;
            }
        }
        g.rms_norm_rows(
            &s.x.as_view(),
            &m.norm.as_view(),
            &mut s.xn.as_view_mut(),
            h,
            n,
            eps,
        )?;
        mark!("rms_norm");
        g.gemv_bf16(
            &m.lm_head.as_view(),
            &s.xn.as_view(),
            &mut s.logits.as_view_mut(),
            c.vocab_size,
            h,
            n,
            false,
        )?;
        mark!("gemv lm_head");
        out.logits
            .extend(st.clone_dtoh(&s.logits.slice(0..n * c.vocab_size))?);
        for r in 0..n {
            for tr in &tap_rows {
                out.taps.extend_from_slice(&tr[r * h..(r + 1) * h]);
            }
        }
        mark!("logits to host");
        if let Some(p) = prof.as_mut() {
            p.collect()?;
        }
        self.profiler = prof;
        self.len = p0 + n;
        Ok(())
    }
}
