//! The kernel modules compiled by NVRTC to machine code (a CUBIN) for one GPU architecture, and
//! where compiled modules are kept.
//!
//! A module's file is named by a key over its source, the architecture and the compile options,
//! so a changed kernel never loads a stale one. Three places are tried in order:
//!
//! 1. `$FASTDECODE_KERNELS`: a directory of modules compiled beforehand (`fastdecode kernels`),
//!    read only. The arena's runner compiles a build's modules once, in that build's own
//!    sandbox, and mounts them read-only into every later worker of the same build: no worker
//!    of a ranked or gated run compiles anything, and no build reads another's modules.
//! 2. The user's cache (`$FASTDECODE_HOME/kernels` or `~/.cache/fastdecode/kernels`).
//! 3. NVRTC now, the result written to the user's cache (best effort).
//!
//! NVRTC needs no GPU, only the architecture's name: `compile_all` compiles every module on
//! a machine without one.

use std::path::{Path, PathBuf};
use std::time::Instant;

use cudarc::nvrtc::sys;
use sha2::{Digest, Sha256};

use crate::error::{CudaError, Result};

const COMMON: &str = include_str!("../kernels/common.cuh");

/// The kernel modules: name and source. Each is compiled once per build and architecture.
pub const MODULES: &[(&str, &str)] = &[
    ("dense", include_str!("../kernels/dense.cu")),
    ("attention", include_str!("../kernels/attention.cu")),
    ("moe", include_str!("../kernels/moe.cu")),
    ("synth", include_str!("../kernels/synth.cu")),
    ("prefill", include_str!("../kernels/prefill.cu")),
];

/// The directory of modules compiled beforehand, when set.
pub const PREBUILT_VAR: &str = "FASTDECODE_KERNELS";

/// NVRTC's options for every module: C++17, device code by default, and the tuning knobs of
/// kernel variants (`FASTDECODE_NVRTC_DEFINES`, e.g. `-DFD_WEIGHT_LOAD=1`), which are part of
/// the key.
fn options() -> Vec<String> {
    let mut opts = vec!["--std=c++17".to_string(), "-default-device".to_string()];
    if let Ok(defs) = std::env::var("FASTDECODE_NVRTC_DEFINES") {
        opts.extend(defs.split_whitespace().map(str::to_string));
    }
    opts
}

/// The file name of module `name` (source `src`) compiled for `arch` with `opts`.
fn file_name(name: &str, src: &str, arch: &str, opts: &[String]) -> String {
    let mut h = Sha256::new();
    h.update(COMMON.as_bytes());
    h.update(b"\n");
    h.update(src.as_bytes());
    h.update(arch.as_bytes());
    h.update(opts.join(" ").as_bytes());
    format!("{name}-{}.cubin", &hex::encode(h.finalize())[..16])
}

fn user_cache() -> PathBuf {
    if let Some(h) = std::env::var_os("FASTDECODE_HOME") {
        return PathBuf::from(h).join("kernels");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".cache/fastdecode/kernels"),
        None => std::env::temp_dir().join("fastdecode-kernels"),
    }
}

/// Module `name`'s machine code for `arch`: compiled beforehand, cached, or compiled now.
pub(crate) fn module(name: &str, src: &str, arch: &str, include: &Path) -> Result<Vec<u8>> {
    let opts = options();
    let file = file_name(name, src, arch, &opts);
    let prebuilt = std::env::var_os(PREBUILT_VAR).map(|d| PathBuf::from(d).join(&file));
    let cached = user_cache().join(&file);
    for p in prebuilt.iter().chain([&cached]) {
        if let Ok(bytes) = std::fs::read(p) {
            return Ok(bytes);
        }
    }
    let cubin = compile(name, src, arch, include, &opts)?;
    // Best effort: a read-only cache directory only costs a recompile next time.
    let _ = crate::nvrtc::write_atomic(&cached, &cubin);
    Ok(cubin)
}

/// Compiles module `name` to a CUBIN for `arch` (a real architecture such as `sm_90a`).
fn compile(name: &str, src: &str, arch: &str, include: &Path, opts: &[String]) -> Result<Vec<u8>> {
    let full = format!("{COMMON}\n{src}");
    let fail = |log: String| CudaError::Compile {
        module: name.to_string(),
        log,
    };
    let code = std::ffi::CString::new(full).map_err(|_| fail("a NUL byte in the source".into()))?;
    let file = std::ffi::CString::new(format!("{name}.cu")).expect("no NUL in a module name");
    let prog = cudarc::nvrtc::result::create_program(&code, Some(&file))
        .map_err(|e| fail(format!("{e:?}")))?;
    let mut all = opts.to_vec();
    all.push(format!("--gpu-architecture={arch}"));
    all.push(format!("--include-path={}", include.display()));
    // SAFETY: `prog` is a live program made above; it is destroyed on every path below.
    let out = unsafe {
        let compiled = cudarc::nvrtc::result::compile_program(prog, &all);
        let out = match compiled {
            Err(e) => Err(fail(log_of(prog).unwrap_or_else(|| format!("{e:?}")))),
            Ok(()) => cubin_of(prog).ok_or_else(|| fail("NVRTC made no CUBIN".into())),
        };
        let _ = cudarc::nvrtc::result::destroy_program(prog);
        out
    };
    out
}

/// The program's compile log.
///
/// # Safety
/// `prog` is a live NVRTC program.
unsafe fn log_of(prog: sys::nvrtcProgram) -> Option<String> {
    let log = cudarc::nvrtc::result::get_program_log(prog).ok()?;
    let bytes: Vec<u8> = log
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The program's CUBIN (compiled for a real architecture).
///
/// # Safety
/// `prog` is a live NVRTC program that compiled.
unsafe fn cubin_of(prog: sys::nvrtcProgram) -> Option<Vec<u8>> {
    let mut n = 0usize;
    if sys::nvrtcGetCUBINSize(prog, &mut n) != sys::nvrtcResult::NVRTC_SUCCESS || n == 0 {
        return None;
    }
    let mut buf = vec![0u8; n];
    (sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast()) == sys::nvrtcResult::NVRTC_SUCCESS)
        .then_some(buf)
}

fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("partial.{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(tmp, path)
}

/// One module compiled by `compile_all`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Compiled {
    pub module: String,
    pub file: String,
    pub bytes: usize,
    pub seconds: f64,
}

/// Compiles every module for `arch` into `out`, the modules side by side on their own threads
/// (NVRTC programs are independent). Needs NVRTC and the CUDA headers, no GPU.
pub fn compile_all(arch: &str, out: &Path) -> Result<Vec<Compiled>> {
    if !unsafe { sys::is_culib_present() } {
        return Err(CudaError::NoNvrtc);
    }
    let include = include_dir()?;
    let opts = options();
    std::thread::scope(|s| {
        let jobs: Vec<_> = MODULES
            .iter()
            .map(|&(name, src)| {
                let (include, opts) = (&include, &opts);
                s.spawn(move || {
                    let t0 = Instant::now();
                    let cubin = compile(name, src, arch, include, opts)?;
                    let file = file_name(name, src, arch, opts);
                    write_atomic(&out.join(&file), &cubin).map_err(|e| {
                        CudaError::Shape(format!("writing {}: {e}", out.join(&file).display()))
                    })?;
                    Ok(Compiled {
                        module: name.to_string(),
                        file,
                        bytes: cubin.len(),
                        seconds: t0.elapsed().as_secs_f64(),
                    })
                })
            })
            .collect();
        jobs.into_iter()
            .map(|j| j.join().expect("a compile thread panicked"))
            .collect()
    })
}

/// The CUDA include directory: `$CUDA_HOME/include`, `$CUDA_PATH/include`, else /usr/local/cuda.
pub(crate) fn include_dir() -> Result<PathBuf> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_module_file_names_its_source_architecture_and_options() {
        let o = vec!["--std=c++17".to_string()];
        let a = file_name("dense", "x", "sm_90a", &o);
        assert!(a.starts_with("dense-") && a.ends_with(".cubin"), "{a}");
        assert_eq!(a, file_name("dense", "x", "sm_90a", &o));
        assert_ne!(a, file_name("dense", "y", "sm_90a", &o));
        assert_ne!(a, file_name("dense", "x", "sm_80", &o));
        assert_ne!(
            a,
            file_name("dense", "x", "sm_90a", &["-DFD_TRACE".to_string()])
        );
    }
}
