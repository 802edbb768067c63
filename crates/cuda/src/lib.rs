//! The CUDA backend: kernels in `kernels/*.cu`, compiled by NVRTC at run time and cached on disk;
//! each kernel has a CPU twin in `fastdecode-cpu` and a comparison test (`tests/kernels.rs`,
//! `tests/prefill.rs`, run on a GPU machine with `--ignored`; `tools/gpu/` stages and runs them).
//!
//! Where things are:
//! - `target.rs` — `CudaTarget`: the KV cache, the forward entry point, the decode step (six
//!   launches per layer, captured as a CUDA graph per row count, programmatic dependent
//!   launches) and the prefill path (tensor cores) for longer runs of rows.
//! - `model.rs` — the weights on the device (uploaded or generated there), stacked where one
//!   kernel reads several projections.
//! - `drafter.rs` — `CudaDrafter`: the DFlash drafter, its layers run by the target's step path
//!   over the target's embedding and lm_head, its context rows from the target's taps.
//! - `dense.rs`, `ops.rs`, `prefill.rs` — launch wrappers that check shapes, next to
//!   `kernels/dense.cu` (embedding, RMSNorm, bf16 GEMV, argmax), `kernels/attention.cu` (q/k norm
//!   with RoPE, split-KV attention), `kernels/moe.cu` (router, NVFP4 expert GEMVs) and
//!   `kernels/prefill.cu` (GEMM, flash attention, grouped MoE); `kernels/common.cuh` holds the
//!   shared device code and the determinism rules.
//! - `device.rs` — opening the GPU (clear errors), NVRTC compilation and its cache, launches;
//!   `params.rs` — each kernel's parameters as a struct in the kernel's order, named as the
//!   `.cu` names them (unit tests check them against the source), launched by `Gpu::run`;
//!   `knobs.rs` — the developer knobs of the environment, checked when the GPU opens.
//! - `timeline.rs` — traced decode steps (`-DFD_TRACE`): launches, per-kernel costs, a waterfall.

pub mod dense;
pub mod device;
pub mod drafter;
pub mod error;
pub mod knobs;
pub mod model;
pub mod nvrtc;
pub mod ops;
mod params;
pub mod prefill;
pub mod profile;
pub mod target;
pub mod timeline;
pub mod weights;

pub use device::Gpu;
pub use drafter::CudaDrafter;
pub use error::{CudaError, Result};
pub use model::CudaModel;
pub use target::CudaTarget;
