//! The seam between decoding policy and compute: a target backend runs the one forward entry point
//! over its own KV cache; a draft source proposes blocks. The CPU reference implements both.

use std::sync::Arc;

use fastdecode_cpu::{DrafterContext, DrafterModel, KvCache, TargetModel};
use fastdecode_model::{LagunaConfig, Result};

use fastdecode_cpu::ops::argmax;
pub use fastdecode_cpu::ForwardOut;

/// The greedy choices of a forward's rows and the tapped hidden states (`rows × taps × hidden`).
pub struct Greedy {
    pub tokens: Vec<u32>,
    pub taps: Vec<f32>,
}

/// A target model with its KV cache.
pub trait TargetBackend {
    fn config(&self) -> &LagunaConfig;
    /// Runs rows `tokens` at `positions` (continuing the cache), appends their K/V and returns the
    /// logits of every row and the hidden states of the `taps` layers.
    fn forward(
        &mut self,
        tokens: &[u32],
        positions: &[usize],
        taps: &[usize],
    ) -> Result<ForwardOut>;
    /// `forward`, keeping only each row's greedy choice (argmax, ties to the lower id), or only
    /// the last row's when `last_only` (a prefill), plus the taps. Decoding needs no more, and a
    /// GPU backend then picks on the device instead of shipping every logit to the host.
    fn forward_greedy(
        &mut self,
        tokens: &[u32],
        positions: &[usize],
        taps: &[usize],
        last_only: bool,
    ) -> Result<Greedy> {
        let out = self.forward(tokens, positions, taps)?;
        let vocab = self.config().vocab_size;
        let first = if last_only { tokens.len() - 1 } else { 0 };
        Ok(Greedy {
            tokens: (first..tokens.len())
                .map(|r| argmax(&out.logits[r * vocab..(r + 1) * vocab]) as u32)
                .collect(),
            taps: out.taps,
        })
    }
    /// A prefill of `tokens` as decoding runs it (`forward_greedy` with `last_only`), returning
    /// the last row's logits: the numbers the first greedy choice is made from. A backend whose
    /// all-row `forward` computes a long run of rows another way (the GPU's prefill GEMMs) must
    /// return these, not those, so that a replay agrees with decoding bit for bit.
    fn prefill_logits(&mut self, tokens: &[u32], positions: &[usize]) -> Result<Vec<f32>> {
        let out = self.forward(tokens, positions, &[])?;
        let vocab = self.config().vocab_size;
        Ok(out.logits[(tokens.len() - 1) * vocab..].to_vec())
    }
    /// Serial greedy decoding from the end of the cache: runs `first`, then each step's own
    /// choice, until `steps` choices are made or one is in `stop`, telling `on_token` each as it
    /// is known; returns how many were made (the cache holds one more position per choice).
    /// This is one-row `forward_greedy` steps; the GPU backend enqueues each step before the
    /// host reads the previous step's choice, so the GPU does not idle between steps.
    fn serial_greedy(
        &mut self,
        first: u32,
        steps: usize,
        stop: &[u32],
        on_token: &mut dyn FnMut(u32),
    ) -> Result<usize> {
        let mut t = first;
        for made in 1..=steps {
            let p = self.kv_len();
            t = self.forward_greedy(&[t], &[p], &[], false)?.tokens[0];
            on_token(t);
            if stop.contains(&t) {
                return Ok(made);
            }
        }
        Ok(steps)
    }
    /// Checks, before a run starts, that a sequence of `positions` positions whose prefill is
    /// `prefill_rows` rows fits this backend's memory. Backends that size their memory when they
    /// are made (and check it then) have nothing more to check.
    fn check_capacity(&self, positions: usize, prefill_rows: usize) -> Result<()> {
        let _ = (positions, prefill_rows);
        Ok(())
    }
    /// Positions held in the KV cache.
    fn kv_len(&self) -> usize;
    /// Rollback to `len` positions (DFlash rejection): a change of logical length only.
    fn truncate(&mut self, len: usize);
    /// Forget everything (a new prompt).
    fn reset(&mut self);
    /// A draft source that lives beside this target on its device and reads the target's tapped
    /// hidden states where they are (the GPU drafter), used when the caller brings none. Its
    /// forwards then return no taps to the host: `commit` gets only the row count.
    fn resident_drafter(&mut self) -> Option<&mut dyn DraftSource> {
        None
    }
}

/// Proposes draft tokens for a DFlash round.
pub trait DraftSource {
    /// Target layers whose hidden states `commit` needs (empty if none).
    fn tap_layers(&self) -> &[usize];
    /// Drafts `k - 1` tokens to follow `bonus`, which sits at position `position`.
    fn propose(&mut self, bonus: u32, position: usize, k: usize) -> Result<Vec<u32>>;
    /// The target committed `rows` more rows; `taps` are their tapped hidden states
    /// (`rows × taps × hidden`), or empty for a resident drafter, which holds them itself.
    fn commit(&mut self, taps: &[f32], rows: usize) -> Result<()>;
    /// Forget all context (a new prompt).
    fn reset(&mut self);
}

/// The CPU reference target.
pub struct CpuTarget {
    pub model: Arc<TargetModel>,
    cache: KvCache,
    max_block: usize,
}

impl CpuTarget {
    pub fn new(model: Arc<TargetModel>, max_block: usize) -> Self {
        let cache = model.new_cache(max_block);
        CpuTarget {
            model,
            cache,
            max_block,
        }
    }
}

impl TargetBackend for CpuTarget {
    fn config(&self) -> &LagunaConfig {
        &self.model.cfg
    }
    fn forward(
        &mut self,
        tokens: &[u32],
        positions: &[usize],
        taps: &[usize],
    ) -> Result<ForwardOut> {
        self.model.forward(&mut self.cache, tokens, positions, taps)
    }
    fn check_capacity(&self, positions: usize, prefill_rows: usize) -> Result<()> {
        crate::limits::check_memory(
            self.model
                .run_bytes(positions, self.max_block, prefill_rows),
            &format!("a run of {positions} positions (KV cache and prefill)"),
        )
    }
    fn kv_len(&self) -> usize {
        self.cache.len()
    }
    fn truncate(&mut self, len: usize) {
        self.cache.truncate(len)
    }
    fn reset(&mut self) {
        self.cache = self.model.new_cache(self.max_block);
    }
}

/// The trained DFlash drafter on the CPU, borrowing the target's embedding and lm_head.
pub struct CpuDrafter {
    target: Arc<TargetModel>,
    drafter: Arc<DrafterModel>,
    ctx: DrafterContext,
}

impl CpuDrafter {
    pub fn new(target: Arc<TargetModel>, drafter: Arc<DrafterModel>) -> Result<Self> {
        drafter.cfg.check_target(&target.cfg)?;
        let ctx = drafter.new_context();
        Ok(CpuDrafter {
            target,
            drafter,
            ctx,
        })
    }
}

impl DraftSource for CpuDrafter {
    fn tap_layers(&self) -> &[usize] {
        &self.drafter.cfg.target_layer_ids
    }
    fn propose(&mut self, bonus: u32, position: usize, k: usize) -> Result<Vec<u32>> {
        if position != self.ctx.len() {
            return Err(fastdecode_model::Error::Input(format!(
                "drafter: bonus at position {position} but context covers 0..{}",
                self.ctx.len()
            )));
        }
        Ok(self.drafter.draft(&self.target, &self.ctx, bonus, k))
    }
    fn commit(&mut self, taps: &[f32], rows: usize) -> Result<()> {
        let per_row = self.drafter.cfg.target_layer_ids.len() * self.drafter.cfg.hidden_size;
        if taps.len() != rows * per_row {
            return Err(fastdecode_model::Error::Input(format!(
                "drafter: {} tapped floats for {rows} committed rows of {per_row}",
                taps.len()
            )));
        }
        self.drafter.extend_context(&mut self.ctx, taps)
    }
    fn reset(&mut self) {
        self.ctx = self.drafter.new_context();
    }
}
