//! `fastdecode worker`: the engine as a worker process speaking the line protocol of
//! `crates/worker/PROTOCOL.md` on stdin/stdout. Parents (`golden make`, `gate`, `bisect`,
//! `price`) start one per phase.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use fastdecode_cpu::flags::Flags;
use fastdecode_engine::model_dir::default_model_dir;
use fastdecode_worker::{Backend, Build, ModelSource, WorkerOptions};

#[derive(Args)]
pub struct WorkerArgs {
    /// Model directory (verified against its MANIFEST before `ready`); the bundled default when omitted.
    #[arg(long, conflicts_with = "synthetic")]
    model: Option<PathBuf>,
    /// CUDA only: generate a preset's synthetic weights in GPU memory instead (e.g. xs2.1).
    #[arg(long)]
    synthetic: Option<String>,
    /// Seed of the --synthetic weights.
    #[arg(long, default_value_t = 0, requires = "synthetic")]
    seed: u64,
    /// CUDA only: the longest context a window may reach (the GPU KV cache is sized for it at
    /// start-up); default: 8192, or the model's max_position_embeddings when smaller.
    #[arg(long)]
    max_context: Option<usize>,
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
        let model = match (&self.model, &self.synthetic) {
            (_, Some(preset)) => ModelSource::Synthetic {
                preset: preset.clone(),
                seed: self.seed,
            },
            (Some(m), None) => ModelSource::Dir(m.clone()),
            (None, None) => ModelSource::Dir(default_model_dir()?),
        };
        let max_context = match self.max_context {
            Some(n) => n,
            None => {
                let cfg = match &model {
                    ModelSource::Dir(d) => {
                        fastdecode_model::LagunaConfig::from_file(&d.join("config.json"))?
                    }
                    ModelSource::Synthetic { preset, .. } => {
                        fastdecode_model::synth::preset(preset)?.target
                    }
                };
                cfg.max_position_embeddings.min(8192)
            }
        };
        Ok(WorkerOptions {
            model,
            backend: self.backend,
            flags,
            max_context,
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
