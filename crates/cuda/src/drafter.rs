//! The DFlash drafter on the GPU (`docs/spec/dflash.md`). Its decoder layers are Laguna layers
//! (sliding attention with the per-head gate, a dense SwiGLU MLP), so its block forward is the
//! target's own step path (`CudaTarget`, batch-invariant, replayed as a CUDA graph per block size)
//! over a drafter-shaped `CudaModel` that shares the target's embedding and lm_head; that session's
//! KV cache holds the context rows. What is the drafter's own: turning the target's tapped hidden
//! states into context rows (aux norms, `fc`, `hidden_norm`, then each layer's K/V).
//! CPU twin: `fastdecode_cpu::drafter::DrafterModel`.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaView};
use half::bf16;

use fastdecode_model::checkpoint::TensorStore;
use fastdecode_model::config::DrafterConfig;
use fastdecode_model::inventory::drafter_inventory;

use crate::dense::{Accumulate, MatShape, Norm, NormRows};
use crate::error::{CudaError, Result};
use crate::model::CudaModel;
use crate::ops::MAX_ROWS;
use crate::target::{CudaTarget, TapsTo};
use crate::weights::WeightSource;

pub struct CudaDrafter {
    pub cfg: DrafterConfig,
    /// The drafter's layers over the target's embedding and lm_head; its KV cache is the context.
    session: CudaTarget,
    ctx: ContextRows,
    /// The target's tapped hidden states of its last forward (`rows × taps × hidden`), waiting
    /// for `commit` to say how many of its rows became context.
    pending: CudaSlice<f32>,
    pending_rows: usize,
}

/// The weights and scratch that turn tapped hidden states into context rows.
struct ContextRows {
    fc: CudaSlice<bf16>,
    hidden_norm: CudaSlice<bf16>,
    /// `aux_hidden_norms.{j}` stacked: one row per tapped layer.
    aux_norms: CudaSlice<bf16>,
    /// For up to `MAX_ROWS` rows: the normed taps, `fc`'s output, its norm.
    cat: CudaSlice<f32>,
    fc_out: CudaSlice<f32>,
    c: CudaSlice<f32>,
}

impl ContextRows {
    /// Context rows from `n <= MAX_ROWS` rows of tapped hidden states (`n × taps × hidden`):
    /// `c = RMSNorm(concat_j RMSNorm(hidden_j; aux_j) · fcᵀ; hidden_norm)`, then every layer's
    /// K/V of `RMSNorm(c; input_layernorm)` at the session's next positions.
    fn append(
        &mut self,
        cfg: &DrafterConfig,
        session: &mut CudaTarget,
        taps: &CudaView<f32>,
        n: usize,
    ) -> Result<()> {
        let (h, t) = (cfg.hidden_size, cfg.target_layer_ids.len());
        let eps = cfg.rms_norm_eps as f32;
        if n == 0 || n > MAX_ROWS || taps.len() < n * t * h {
            return Err(CudaError::Shape(format!(
                "drafter context: {n} rows (1..={MAX_ROWS}) of {t} taps × {h} from {} floats",
                taps.len()
            )));
        }
        let gpu = session.model.gpu.clone();
        gpu.set_pdl(false);
        gpu.rms_norm_rows(
            taps,
            Norm {
                w: &self.aux_norms.as_view(),
                eps,
            },
            &mut self.cat.as_view_mut(),
            NormRows {
                rows: n * t,
                n: h,
                w_rows: t,
            },
        )?;
        gpu.gemv_bf16(
            &self.fc.as_view(),
            &self.cat.as_view(),
            None,
            &mut self.fc_out.as_view_mut(),
            MatShape {
                out: h,
                inp: t * h,
                rows: n,
            },
            Accumulate::Overwrite,
        )?;
        gpu.rms_norm_rows(
            &self.fc_out.as_view(),
            Norm {
                w: &self.hidden_norm.as_view(),
                eps,
            },
            &mut self.c.as_view_mut(),
            NormRows {
                rows: n,
                n: h,
                w_rows: 1,
            },
        )?;
        session.append_kv_rows(&self.c.as_view(), n)
    }
}

impl CudaDrafter {
    /// Uploads `drafter/` (`cfg` its config, `store` its safetensors) beside `target`, for
    /// contexts of up to `max_positions` and blocks of up to `MAX_ROWS`.
    pub fn upload(
        target: &CudaModel,
        cfg: DrafterConfig,
        store: &TensorStore,
        max_positions: usize,
    ) -> Result<Self> {
        store.check(&drafter_inventory(&cfg), true)?;
        Self::build(target, cfg, &WeightSource::Store(store), max_positions)
    }

    /// `synth`'s drafter weights for `cfg` at `seed`, generated in GPU memory.
    pub fn synthetic(
        target: &CudaModel,
        cfg: DrafterConfig,
        seed: u64,
        max_positions: usize,
    ) -> Result<Self> {
        let specs = drafter_inventory(&cfg);
        Self::build(
            target,
            cfg,
            &WeightSource::synthetic(seed, &specs),
            max_positions,
        )
    }

    fn build(
        target: &CudaModel,
        cfg: DrafterConfig,
        store: &WeightSource,
        max_positions: usize,
    ) -> Result<Self> {
        cfg.check_target(&target.cfg)?;
        let (h, t) = (cfg.hidden_size, cfg.target_layer_ids.len());
        let model = target.sibling(cfg.as_laguna(&target.cfg), "layers", "norm.weight", store)?;
        let g = target.gpu.as_ref();
        let st = &g.stream;
        let mut aux_norms = st.alloc_zeros::<bf16>(t * h)?;
        for j in 0..t {
            let w = store.bf16(g, &format!("aux_hidden_norms.{j}.weight"))?;
            st.memcpy_dtod(&w, &mut aux_norms.slice_mut(j * h..(j + 1) * h))?;
        }
        let block = cfg.block_size.min(MAX_ROWS);
        Ok(CudaDrafter {
            session: CudaTarget::new(Arc::new(model), block, max_positions)?,
            ctx: ContextRows {
                fc: store.bf16(g, "fc.weight")?,
                hidden_norm: store.bf16(g, "hidden_norm.weight")?,
                aux_norms,
                cat: st.alloc_zeros(MAX_ROWS * t * h)?,
                fc_out: st.alloc_zeros(MAX_ROWS * h)?,
                c: st.alloc_zeros(MAX_ROWS * h)?,
            },
            pending: st.alloc_zeros(max_positions * t * h)?,
            pending_rows: 0,
            cfg,
        })
    }

    /// Positions `0..len` have context rows.
    pub fn len(&self) -> usize {
        self.session.len()
    }

    pub fn is_empty(&self) -> bool {
        self.session.is_empty()
    }

    /// Forget all context (a new prompt).
    pub fn reset(&mut self) {
        self.session.reset();
        self.pending_rows = 0;
    }

    /// Where the target's next forward leaves its tapped hidden states for this drafter.
    pub fn pending_taps(&mut self, rows: usize) -> TapsTo<'_> {
        self.pending_rows = rows;
        TapsTo::Device(&mut self.pending)
    }

    /// The first `rows` rows of the pending taps became committed positions: their context rows
    /// are appended (`docs/spec/dflash.md`, round step 1).
    pub fn commit(&mut self, rows: usize) -> Result<()> {
        if rows > self.pending_rows {
            return Err(CudaError::Shape(format!(
                "drafter: {rows} rows committed but the target's last forward tapped {}",
                self.pending_rows
            )));
        }
        let per = self.cfg.target_layer_ids.len() * self.cfg.hidden_size;
        let mut start = 0;
        while start < rows {
            let n = (rows - start).min(MAX_ROWS);
            self.ctx.append(
                &self.cfg,
                &mut self.session,
                &self.pending.slice(start * per..(start + n) * per),
                n,
            )?;
            start += n;
        }
        self.pending_rows = 0;
        Ok(())
    }

    /// Context rows straight from `n <= MAX_ROWS` rows of tapped hidden states on the device
    /// (`n × taps × hidden`): what `commit` does for pending rows.
    pub fn extend(&mut self, taps: &CudaView<f32>, n: usize) -> Result<()> {
        self.ctx.append(&self.cfg, &mut self.session, taps, n)
    }

    /// The logits of block rows 1..k (what `draft` takes the argmax of), copied to the host:
    /// for comparison with the CPU drafter.
    pub fn block_logits(&mut self, bonus: u32, k: usize) -> Result<Vec<f32>> {
        let o = self.session.len();
        let mut rows = vec![self.cfg.mask_token_id; k];
        rows[0] = bonus;
        let positions: Vec<usize> = (o..o + k).collect();
        let out = self.session.forward(&rows, &positions, &[])?;
        self.session.truncate(o);
        let v = self.session.model.cfg.vocab_size;
        Ok(out.logits[v..].to_vec())
    }

    /// Drafts `k - 1` tokens to follow `bonus` at position `len()`: the block `[bonus, mask, …]`
    /// through the drafter's layers (its rows attend to the context in their window and causally
    /// to each other), the greedy choice of rows 1.. through the target's lm_head. The block's
    /// K/V leave the cache again (the next context rows overwrite them).
    pub fn draft(&mut self, bonus: u32, k: usize) -> Result<Vec<u32>> {
        if k < 2 || k > self.cfg.block_size.min(MAX_ROWS) {
            return Err(CudaError::Shape(format!(
                "drafter: block size {k} is outside 2..={}",
                self.cfg.block_size.min(MAX_ROWS)
            )));
        }
        let o = self.session.len();
        let mut rows = vec![self.cfg.mask_token_id; k];
        rows[0] = bonus;
        let positions: Vec<usize> = (o..o + k).collect();
        let (ids, _) = self
            .session
            .forward_greedy(&rows, &positions, &[], false, TapsTo::Host)?;
        self.session.truncate(o);
        Ok(ids[1..].to_vec())
    }
}
