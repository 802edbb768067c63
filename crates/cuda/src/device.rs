//! Opening the GPU: driver, device, NVRTC and header checks, and kernel modules compiled by
//! NVRTC at run time for the device's architecture (`sm_90a` on Hopper), cached on disk.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::{CompileOptions, Ptx};
use sha2::{Digest, Sha256};

use crate::error::{CudaError, Result};

const COMMON: &str = include_str!("../kernels/common.cuh");

/// The kernel modules: name and source. Each is compiled once per process (and cached on disk).
pub const MODULES: &[(&str, &str)] = &[
    ("dense", include_str!("../kernels/dense.cu")),
    ("attention", include_str!("../kernels/attention.cu")),
    ("moe", include_str!("../kernels/moe.cu")),
    ("synth", include_str!("../kernels/synth.cu")),
    ("prefill", include_str!("../kernels/prefill.cu")),
];

/// A launch of `grid.0 × grid.1` blocks of `block` threads with `shared` bytes of dynamic shared memory.
pub(crate) fn launch_cfg(
    grid: (u32, u32),
    block: u32,
    shared: u32,
) -> cudarc::driver::LaunchConfig {
    cudarc::driver::LaunchConfig {
        grid_dim: (grid.0, grid.1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: shared,
    }
}

pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub name: String,
    /// Streaming multiprocessors: persistent kernels launch a whole number of blocks per SM.
    pub sm_count: u32,
    arch: &'static str,
    include: PathBuf,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
}

/// The CUDA include directory: `$CUDA_HOME/include`, `$CUDA_PATH/include`, else /usr/local/cuda.
fn include_dir() -> Result<PathBuf> {
    let mut tried = vec![];
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            tried.push(PathBuf::from(v).join("include"));
        }
    }
    tried.push(PathBuf::from("/usr/local/cuda/include"));
    for d in &tried {
        if d.join("cuda_bf16.h").is_file() {
            return Ok(d.clone());
        }
    }
    Err(CudaError::NoHeaders(tried))
}

fn arch_for(major: i32, minor: i32) -> Result<&'static str> {
    // `a` targets unlock the architecture-specific instructions (wgmma, setmaxnreg on sm_90a).
    Ok(match (major, minor) {
        (8, 0) => "sm_80",
        (8, 6) => "sm_86",
        (8, 7) => "sm_87",
        (8, 9) => "sm_89",
        (9, 0) => "sm_90a",
        (10, 0) => "sm_100a",
        (12, 0) => "sm_120a",
        _ => return Err(CudaError::Arch(major, minor)),
    })
}

fn cache_dir() -> PathBuf {
    if let Some(h) = std::env::var_os("FASTDECODE_HOME") {
        return PathBuf::from(h).join("kernels");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".cache/fastdecode/kernels"),
        None => std::env::temp_dir().join("fastdecode-kernels"),
    }
}

impl Gpu {
    /// Opens device `ordinal`, failing with a clear error when there is no driver, device, NVRTC
    /// or header directory.
    pub fn open(ordinal: usize) -> Result<Gpu> {
        // cudarc's dynamic loader panics on a missing library; check first.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(CudaError::NoDriver);
        }
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(CudaError::NoNvrtc);
        }
        let include = include_dir()?;
        let ctx = CudaContext::new(ordinal).map_err(|e| CudaError::NoDevice(e.to_string()))?;
        let (major, minor) = ctx.compute_capability()?;
        let arch = arch_for(major, minor)?;
        let name = ctx.name()?;
        let sm_count = ctx.attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )? as u32;
        // One non-default stream for all work: CUDA graphs cannot capture the legacy default
        // stream. With a single stream cudarc's cross-stream event tracking has nothing to order,
        // and its events would break a capture, so it is off.
        // SAFETY: every slice of this context is used on this one stream.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        Ok(Gpu {
            ctx,
            stream,
            name,
            sm_count,
            arch,
            include,
            modules: Mutex::new(HashMap::new()),
        })
    }

    pub fn arch(&self) -> &'static str {
        self.arch
    }

    fn compile(&self, name: &str, src: &str) -> Result<Ptx> {
        let full = format!("{COMMON}\n{src}");
        let mut opts = vec!["--std=c++17".to_string(), "-default-device".to_string()];
        // Tuning knobs for kernel variants (e.g. `-DFD_WEIGHT_LOAD=1`), part of the cache key.
        if let Ok(defs) = std::env::var("FASTDECODE_NVRTC_DEFINES") {
            opts.extend(defs.split_whitespace().map(str::to_string));
        }
        let key = {
            let mut h = Sha256::new();
            h.update(full.as_bytes());
            h.update(self.arch.as_bytes());
            h.update(opts.join(" ").as_bytes());
            hex::encode(h.finalize())
        };
        let dir = cache_dir();
        let path = dir.join(format!("{name}-{}.ptx", &key[..16]));
        if let Ok(text) = std::fs::read_to_string(&path) {
            return Ok(Ptx::from_src(text));
        }
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(
            &full,
            CompileOptions {
                arch: Some(self.arch),
                include_paths: vec![self.include.display().to_string()],
                options: opts,
                name: Some(format!("{name}.cu")),
                ..Default::default()
            },
        )
        .map_err(|e| CudaError::Compile {
            module: name.to_string(),
            log: match e {
                cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                    log.to_string_lossy().into_owned()
                }
                other => format!("{other:?}"),
            },
        })?;
        // Best effort: a read-only cache directory only costs a recompile next time.
        let _ = write_cache(&dir, &path, &ptx.to_src());
        Ok(ptx)
    }

    /// Blocks for a persistent kernel: as many as stay resident at once (all SMs full), or
    /// `needed` if fewer do the work.
    pub(crate) fn persistent_grid(
        &self,
        f: &CudaFunction,
        block: u32,
        shared: usize,
        needed: usize,
    ) -> Result<u32> {
        let per_sm = f
            .occupancy_max_active_blocks_per_multiprocessor(block, shared, None)?
            .max(1);
        Ok((needed.max(1) as u32).min(per_sm * self.sm_count))
    }

    /// A kernel function, compiling and loading its module on first use.
    pub fn function(&self, module: &'static str, func: &str) -> Result<CudaFunction> {
        let mut mods = self.modules.lock().expect("module cache lock");
        let m = match mods.get(module) {
            Some(m) => m.clone(),
            None => {
                let src = MODULES
                    .iter()
                    .find(|(n, _)| *n == module)
                    .map(|(_, s)| *s)
                    .ok_or_else(|| CudaError::Shape(format!("no kernel module {module}")))?;
                let m = self.ctx.load_module(self.compile(module, src)?)?;
                mods.insert(module, m.clone());
                m
            }
        };
        Ok(m.load_function(func)?)
    }
}

fn write_cache(dir: &Path, path: &Path, text: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension("ptx.partial");
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, path)
}
