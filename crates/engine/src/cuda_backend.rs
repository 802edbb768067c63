//! The CUDA target behind the same `TargetBackend` seam as the CPU reference, with the DFlash
//! drafter beside it on the GPU (a resident draft source: the target's tapped hidden states stay
//! on the device, and no CPU copy of the model exists).

use std::path::Path;
use std::sync::Arc;

use fastdecode_cuda::target::TapsTo;
use fastdecode_cuda::{CudaDrafter, CudaModel, CudaTarget, Gpu};
use fastdecode_model::checkpoint::TensorStore;
use fastdecode_model::config::DrafterConfig;
use fastdecode_model::{Error, LagunaConfig, Result};

use crate::backend::{DraftSource, ForwardOut, Greedy, TargetBackend};

pub struct CudaBackend {
    target: CudaTarget,
    drafter: Option<GpuDrafter>,
}

fn backend_err(e: fastdecode_cuda::CudaError) -> Error {
    match e {
        fastdecode_cuda::CudaError::Model(m) => m,
        other => Error::Backend(other.to_string()),
    }
}

impl CudaBackend {
    pub fn new(model: Arc<CudaModel>, max_block: usize, max_positions: usize) -> Result<Self> {
        Ok(CudaBackend {
            target: CudaTarget::new(model, max_block, max_positions).map_err(backend_err)?,
            drafter: None,
        })
    }

    /// Uploads a runtime checkpoint directory to GPU 0, with its `drafter/` when `drafter` is
    /// set and the directory has one.
    pub fn open_dir(
        dir: &Path,
        max_block: usize,
        max_positions: usize,
        drafter: bool,
    ) -> Result<Self> {
        let gpu = Arc::new(Gpu::open(0).map_err(backend_err)?);
        let cfg = LagunaConfig::from_file(&dir.join("config.json"))?;
        let store = TensorStore::open_dir(dir)?;
        let model = Arc::new(CudaModel::upload(gpu, cfg, &store).map_err(backend_err)?);
        let mut b = Self::new(model.clone(), max_block, max_positions)?;
        let ddir = dir.join("drafter");
        if drafter && ddir.join("config.json").is_file() {
            let dcfg = DrafterConfig::from_file(&ddir.join("config.json"))?;
            let dstore = TensorStore::open_dir(&ddir)?;
            let d =
                CudaDrafter::upload(&model, dcfg, &dstore, max_positions).map_err(backend_err)?;
            b.drafter = Some(GpuDrafter(d));
        }
        Ok(b)
    }

    /// A preset's synthetic target (and drafter, when `drafter`) generated in GPU 0's memory.
    pub fn synthetic(
        preset: &fastdecode_model::synth::Preset,
        seed: u64,
        max_block: usize,
        max_positions: usize,
        drafter: bool,
    ) -> Result<Self> {
        let gpu = Arc::new(Gpu::open(0).map_err(backend_err)?);
        let model =
            Arc::new(CudaModel::synthetic(gpu, preset.target.clone(), seed).map_err(backend_err)?);
        let mut b = Self::new(model.clone(), max_block, max_positions)?;
        if drafter {
            let d = CudaDrafter::synthetic(&model, preset.drafter.clone(), seed, max_positions)
                .map_err(backend_err)?;
            b.drafter = Some(GpuDrafter(d));
        }
        Ok(b)
    }

    /// The GPU session itself (profiling, KV inspection).
    pub fn session(&mut self) -> &mut CudaTarget {
        &mut self.target
    }

    /// Whether the GPU drafter is loaded (the `drafter` source runs there).
    pub fn has_drafter(&self) -> bool {
        self.drafter.is_some()
    }

    /// The GPU drafter's largest block size, when loaded.
    pub fn drafter_block_size(&self) -> Option<usize> {
        self.drafter.as_ref().map(|d| d.0.cfg.block_size)
    }
}

impl TargetBackend for CudaBackend {
    fn config(&self) -> &LagunaConfig {
        &self.target.model.cfg
    }
    fn forward(
        &mut self,
        tokens: &[u32],
        positions: &[usize],
        taps: &[usize],
    ) -> Result<ForwardOut> {
        self.target
            .forward(tokens, positions, taps)
            .map_err(backend_err)
    }
    fn forward_greedy(
        &mut self,
        tokens: &[u32],
        positions: &[usize],
        taps: &[usize],
        last_only: bool,
    ) -> Result<Greedy> {
        // The resident drafter's taps stay on the device, in its pending buffer.
        let to = match &mut self.drafter {
            Some(d) if !taps.is_empty() && taps == d.0.cfg.target_layer_ids.as_slice() => {
                d.0.pending_taps(tokens.len())
            }
            _ => TapsTo::Host,
        };
        let (tokens, taps) = self
            .target
            .forward_greedy(tokens, positions, taps, last_only, to)
            .map_err(backend_err)?;
        Ok(Greedy { tokens, taps })
    }
    fn prefill_logits(&mut self, tokens: &[u32], positions: &[usize]) -> Result<Vec<f32>> {
        self.target
            .prefill_logits(tokens, positions)
            .map_err(backend_err)
    }
    fn serial_greedy(
        &mut self,
        first: u32,
        steps: usize,
        stop: &[u32],
        on_token: &mut dyn FnMut(u32),
    ) -> Result<usize> {
        self.target
            .serial_greedy(first, steps, stop, on_token)
            .map_err(backend_err)
    }
    fn kv_len(&self) -> usize {
        self.target.len()
    }
    fn truncate(&mut self, len: usize) {
        self.target.truncate(len)
    }
    fn reset(&mut self) {
        self.target.reset()
    }
    fn resident_drafter(&mut self) -> Option<&mut dyn DraftSource> {
        self.drafter.as_mut().map(|d| d as &mut dyn DraftSource)
    }
}

/// The GPU drafter as a draft source: it proposes from its device-side context and takes the
/// committed rows' taps from the target's last forward, which left them in its buffer.
struct GpuDrafter(CudaDrafter);

impl DraftSource for GpuDrafter {
    fn tap_layers(&self) -> &[usize] {
        &self.0.cfg.target_layer_ids
    }
    fn propose(&mut self, bonus: u32, position: usize, k: usize) -> Result<Vec<u32>> {
        if position != self.0.len() {
            return Err(Error::Input(format!(
                "drafter: bonus at position {position} but context covers 0..{}",
                self.0.len()
            )));
        }
        self.0.draft(bonus, k).map_err(backend_err)
    }
    fn commit(&mut self, taps: &[f32], rows: usize) -> Result<()> {
        if !taps.is_empty() {
            return Err(Error::Input(
                "the GPU drafter reads its taps on the device, not from the host".into(),
            ));
        }
        self.0.commit(rows).map_err(backend_err)
    }
    fn reset(&mut self) {
        self.0.reset()
    }
}
