//! The CUDA backend: kernels in `kernels/*.cu`, compiled by NVRTC at run time and cached on disk;
//! each kernel has a CPU twin in `fastdecode-cpu` and a comparison test (`tests/kernels.rs`, run on
//! a GPU machine with `--ignored`).

pub mod dense;
pub mod device;
pub mod error;
pub mod model;
pub mod ops;
pub mod prefill;
pub mod profile;
pub mod target;
pub mod weights;

pub use device::Gpu;
pub use error::{CudaError, Result};
pub use model::CudaModel;
pub use target::CudaTarget;
