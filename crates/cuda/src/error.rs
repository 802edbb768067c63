//! Errors of the CUDA backend, each saying what is missing and how to fix it.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("no NVIDIA driver: libcuda.so could not be loaded (is this a GPU machine? is the driver installed and on LD_LIBRARY_PATH?)")]
    NoDriver,
    #[error("no usable CUDA device: {0}")]
    NoDevice(String),
    #[error("NVRTC (libnvrtc.so) could not be loaded: install the CUDA toolkit's NVRTC or put it on LD_LIBRARY_PATH")]
    NoNvrtc,
    #[error("CUDA headers not found: looked for cuda_bf16.h in {0:?}; set CUDA_HOME (or CUDA_PATH) to the CUDA toolkit")]
    NoHeaders(Vec<PathBuf>),
    #[error("compute capability {0}.{1} is not supported (need 8.0 or newer)")]
    Arch(i32, i32),
    #[error("NVRTC failed to compile kernel module {module}:\n{log}")]
    Compile { module: String, log: String },
    #[error("cuBLAS (the prefill GEMMs): {0}")]
    Blas(String),
    #[error("CUDA driver error: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    #[error("launch of kernel {kernel} (grid {grid:?}, block {block:?}, {shared} bytes of dynamic shared memory): {source}")]
    Launch {
        kernel: String,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared: u32,
        source: cudarc::driver::DriverError,
    },
    #[error("{var}={value:?}: not a value it takes (one of {})", accepted.join(", "))]
    Knob {
        var: &'static str,
        value: String,
        accepted: &'static [&'static str],
    },
    #[error("{0}")]
    Shape(String),
    #[error(transparent)]
    Model(#[from] fastdecode_model::Error),
}

pub type Result<T, E = CudaError> = std::result::Result<T, E>;

/// `Ok` when `cond` holds, else a shape error with the message: the launch wrappers' checks.
pub(crate) fn check(cond: bool, msg: impl FnOnce() -> String) -> Result<()> {
    if cond {
        Ok(())
    } else {
        Err(CudaError::Shape(msg()))
    }
}
