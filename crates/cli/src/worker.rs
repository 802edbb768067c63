//! `fastdecode worker`: the engine as a worker process speaking the line protocol of
//! `crates/worker/PROTOCOL.md` on stdin/stdout. Parents (`golden make`, `gate`, `bisect`,
//! `price`) start one per phase.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use fastdecode_cpu::flags::Flags;
use fastdecode_engine::model_dir::default_model_dir;
use fastdecode_worker::{Backend, Build, WorkerOptions};

#[derive(Args)]
pub struct WorkerArgs {
    /// Model directory (verified against its MANIFEST before `ready`); the bundled default when omitted.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Compute backend.
    #[arg(long, default_value = "cpu")]
    backend: Backend,
    /// Optimisation flags to switch on, comma-separated (unrolled_dot, fast_exp); default: $FASTDECODE_FLAGS.
    #[arg(long)]
    flags: Option<String>,
}

impl WorkerArgs {
    fn options(&self) -> Result<WorkerOptions> {
        let flags = match &self.flags {
            Some(f) => Flags::parse(f),
            None => Flags::from_env(),
        }
        .map_err(anyhow::Error::msg)
        .context("--flags")?;
        let model = match &self.model {
            Some(m) => m.clone(),
            None => default_model_dir()?,
        };
        Ok(WorkerOptions {
            model,
            backend: self.backend,
            flags,
        })
    }
}

/// The build this binary is.
fn build() -> Build {
    Build {
        version: env!("CARGO_PKG_VERSION").into(),
        commit: env!("FASTDECODE_GIT_COMMIT").into(),
    }
}

/// Serves requests from `input` (stdin) on `output` (stdout).
pub fn serve(
    a: WorkerArgs,
    input: impl std::io::BufRead,
    output: impl std::io::Write,
) -> Result<()> {
    let opts = a.options()?;
    fastdecode_worker::serve::run(&opts, build(), input, output)
}
