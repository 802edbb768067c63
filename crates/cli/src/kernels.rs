//! `fastdecode kernels`: compiles this build's CUDA kernel modules for one GPU architecture into
//! a directory, ahead of any worker. A worker started with `FASTDECODE_KERNELS` set to that
//! directory loads them instead of compiling (the arena's runner does this once per build, so
//! no gated or timed worker ever compiles). NVRTC needs no GPU when `--arch` is given.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;

#[derive(Args)]
pub struct KernelsArgs {
    /// The directory the compiled modules go to: a new one, or an empty one.
    #[arg(long)]
    out: PathBuf,
    /// The GPU architecture (sm_80, sm_86, sm_87, sm_89, sm_90a, sm_100a, sm_120a); default: the
    /// first GPU's.
    #[arg(long, value_parser = architecture)]
    arch: Option<String>,
    /// Print the modules as JSON.
    #[arg(long)]
    json: bool,
}

const ARCHES: &[&str] = &[
    "sm_80", "sm_86", "sm_87", "sm_89", "sm_90a", "sm_100a", "sm_120a",
];

fn architecture(s: &str) -> std::result::Result<String, String> {
    if ARCHES.contains(&s) {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not one of {}", ARCHES.join(", ")))
    }
}

pub fn run(a: KernelsArgs) -> Result<()> {
    if let Ok(mut entries) = std::fs::read_dir(&a.out) {
        if entries.next().is_some() {
            bail!(
                "--out {}: the directory is not empty (kernels go to a new or empty one)",
                a.out.display()
            );
        }
    } else if a.out.exists() {
        bail!("--out {}: not a directory", a.out.display());
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("--out {}", a.out.display()))?;
    let arch = match &a.arch {
        Some(x) => x.clone(),
        None => fastdecode_cuda::device::Gpu::open(0)
            .context("finding the GPU's architecture (or give --arch)")?
            .arch()
            .to_string(),
    };
    let t0 = Instant::now();
    let done = fastdecode_cuda::nvrtc::compile_all(&arch, &a.out)?;
    let seconds = t0.elapsed().as_secs_f64();
    if a.json {
        let v = serde_json::json!({"arch": arch, "seconds": seconds, "modules": done});
        outln!("{}", serde_json::to_string_pretty(&v)?)?;
        return Ok(());
    }
    for c in &done {
        outln!(
            "{:<10} {:>9} bytes {:>7.1} s  {}",
            c.module,
            c.bytes,
            c.seconds,
            c.file
        )?;
    }
    outln!(
        "{} modules for {arch} in {seconds:.1} s, in {}",
        done.len(),
        a.out.display()
    )?;
    Ok(())
}
