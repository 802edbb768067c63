//! The CUDA target behind the same `TargetBackend` seam as the CPU reference.

use std::sync::Arc;

use fastdecode_cuda::{CudaModel, CudaTarget};
use fastdecode_model::{Error, LagunaConfig, Result};

use crate::backend::{ForwardOut, Greedy, TargetBackend};

pub struct CudaBackend {
    target: CudaTarget,
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
        })
    }
}

impl CudaBackend {
    /// The GPU session itself (profiling, KV inspection).
    pub fn session(&mut self) -> &mut CudaTarget {
        &mut self.target
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
        let (tokens, taps) = self
            .target
            .forward_greedy(tokens, positions, taps, last_only)
            .map_err(backend_err)?;
        Ok(Greedy { tokens, taps })
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
}
