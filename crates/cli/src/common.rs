//! Arguments shared by the commands that drive worker processes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;

use fastdecode_engine::model_dir::default_model_dir;
use fastdecode_gate::Golden;
use fastdecode_worker::{ModelId, Spec};

#[derive(Args, Clone)]
pub struct WorkerSide {
    /// Model directory the workers load; the bundled default when omitted.
    #[arg(long, conflicts_with = "synthetic")]
    pub model: Option<PathBuf>,
    /// Workers generate this preset's synthetic weights in GPU memory instead of loading a
    /// directory (e.g. xs2.1; needs --backend cuda).
    #[arg(long)]
    pub synthetic: Option<String>,
    /// Seed of the --synthetic weights.
    #[arg(long, default_value_t = 0, requires = "synthetic")]
    pub synthetic_seed: u64,
    /// Backend the workers run on (cpu or cuda).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
    pub backend: String,
    /// Seconds a worker may take to load, verify and warm up.
    #[arg(long, default_value_t = 300.0)]
    pub ready_timeout: f64,
    /// Seconds any one request may take before the worker counts as hung.
    #[arg(long, default_value_t = 600.0)]
    pub timeout: f64,
}

impl WorkerSide {
    pub fn model(&self) -> Result<ModelId> {
        if let Some(preset) = &self.synthetic {
            if self.backend != "cuda" {
                bail!("--synthetic {preset}: synthetic weights are generated in GPU memory; add --backend cuda");
            }
            return ModelId::synthetic(preset, self.synthetic_seed);
        }
        let dir = match &self.model {
            Some(d) => d.clone(),
            None => default_model_dir()?,
        };
        ModelId::of(&dir)
    }

    pub fn spec(&self, bin: &Path, model: &ModelId, flags: Option<String>) -> Spec {
        Spec {
            bin: bin.to_path_buf(),
            model: model.source.clone(),
            backend: self.backend.clone(),
            flags,
            ready_timeout: Duration::from_secs_f64(self.ready_timeout),
            request_timeout: Duration::from_secs_f64(self.timeout),
        }
    }
}

/// Called by every command that drives workers: a worker that dies makes the parent's next write
/// to it fail with EPIPE, which must come back as an error (a crashed worker), not kill the parent
/// through SIGPIPE (which `main` restores to its default for pipelines like `inspect | head`).
pub fn parent_of_workers() {
    #[cfg(unix)]
    // SAFETY: changing one signal's disposition; no handler runs Rust code.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

/// This binary, the default build for every side.
pub fn this_binary() -> Result<PathBuf> {
    std::env::current_exe().context("locating this binary")
}

/// Loads goldens from files and directories (every `*.json` in a directory, sorted).
pub fn load_goldens(paths: &[PathBuf]) -> Result<Vec<(PathBuf, Golden)>> {
    let mut files = vec![];
    for p in paths {
        if p.is_dir() {
            let mut v: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| p.display().to_string())?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "json"))
                .collect();
            v.sort();
            if v.is_empty() {
                bail!("{}: no *.json golden traces", p.display());
            }
            files.extend(v);
        } else {
            files.push(p.clone());
        }
    }
    files
        .into_iter()
        .map(|f| Golden::load(&f).map(|g| (f, g)))
        .collect()
}

/// Writes `text` to `path` atomically.
pub fn write_file(path: &Path, text: &str) -> Result<()> {
    if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d).with_context(|| d.display().to_string())?;
    }
    fastdecode_model::checkpoint::write_atomic(path, text.as_bytes())?;
    Ok(())
}
