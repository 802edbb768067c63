//! Arguments shared by the commands that drive worker processes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

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
    #[arg(long, allow_negative_numbers = true, default_value_t = 300.0, value_parser = seconds)]
    pub ready_timeout: f64,
    /// Seconds any one request may take before the worker counts as hung.
    #[arg(long, allow_negative_numbers = true, default_value_t = 600.0, value_parser = seconds)]
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
            drafter: true,
        }
    }
}

/// A duration option in seconds: a positive number of at most a week (what a `Duration` holds,
/// with room to spare).
pub fn seconds(s: &str) -> std::result::Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if !(v > 0.0 && v <= 604_800.0) {
        return Err(format!("{s} is not in (0, 604800] seconds"));
    }
    Ok(v)
}

/// A probability or fraction option: a number in [0, 1].
pub fn fraction(s: &str) -> std::result::Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("{s} is not in [0, 1]"));
    }
    Ok(v)
}

/// A budget per 1000 tokens: a number in [0, 1000].
pub fn per_1000(s: &str) -> std::result::Result<f64, String> {
    let v = non_negative(s)?;
    if v > 1000.0 {
        return Err(format!("{s} is more than 1000 per 1000"));
    }
    Ok(v)
}

/// A gap, envelope or tolerance option: a finite number >= 0.
pub fn non_negative(s: &str) -> std::result::Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("{s} is not a finite number >= 0"));
    }
    Ok(v)
}

/// `non_negative`, as the f32 that logit gaps are compared in.
pub fn non_negative_f32(s: &str) -> std::result::Result<f32, String> {
    let v = non_negative(s)?;
    if v > f32::MAX as f64 {
        return Err(format!("{s} is larger than an f32 holds"));
    }
    Ok(v as f32)
}

/// A count option of at least `min`.
pub fn at_least(min: u64) -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(min..)
}

/// A count option in `min..=max`.
pub fn between(min: u64, max: u64) -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(min..=max)
}

/// The largest DFlash block any source accepts (the drafter's trained size may be smaller).
pub const MAX_BLOCK: u64 = fastdecode_model::config::MAX_BLOCK_SIZE as u64;

/// Checks that `prompt_len` prompt tokens and `new_tokens` new ones fit the model, naming the
/// option (`what`) that asked for them.
pub fn check_fits(
    cfg: &fastdecode_model::LagunaConfig,
    dir: &Path,
    prompt_len: usize,
    new_tokens: usize,
    what: &str,
) -> Result<()> {
    fastdecode_engine::limits::check_length(cfg, prompt_len, new_tokens)
        .with_context(|| format!("{what} (model {})", dir.display()))
}

/// Checks prompt token ids against the vocabulary, naming where they came from (`what`).
pub fn check_ids(ids: &[u32], vocab: usize, what: &str) -> Result<()> {
    if ids.is_empty() {
        bail!("{what}: the prompt has no tokens");
    }
    if let Some((i, t)) = ids.iter().enumerate().find(|(_, &t)| t as usize >= vocab) {
        bail!("{what}: token {i} has id {t}, outside the model's vocabulary 0..{vocab}");
    }
    Ok(())
}

/// Refuses, before anything runs, an output that would write over, into or around an input of
/// the same run (the same file by any name, a path inside an input directory, a directory
/// holding an input): each output (its option, its path) against each input (what it is, its
/// path). A user who names a CSV as its own SVG loses nothing.
pub fn outputs_apart(outputs: &[(&str, &Path)], inputs: &[(&str, &Path)]) -> Result<()> {
    for (option, out) in outputs {
        for (what, input) in inputs {
            fastdecode_model::files::refuse_overlap(out, input, what)
                .with_context(|| option.to_string())?;
        }
    }
    Ok(())
}

/// Checks, before a long run, that a report file can be written at `path`, and that it is not
/// inside the model directory (whose MANIFEST it would break). `what` names the option.
pub fn check_report_path(path: &Path, model: &ModelId, what: &str) -> Result<()> {
    match model.dir() {
        Some(dir) => fastdecode_model::files::refuse_overlap(path, dir, "model directory"),
        None => Ok(()),
    }
    .and_then(|()| fastdecode_model::files::check_output_file(path))
    .with_context(|| what.to_string())
}

/// The build at `path` (an option's value, named by `what`), checked before any worker is
/// started: a path that is not an executable file is the user's mistake, not a build's crash.
/// Returned absolute, so a bare name means the file here, not a program on `PATH`.
pub fn check_binary(path: &Path, what: &str) -> Result<PathBuf> {
    let m = std::fs::metadata(path)
        .map_err(|e| fastdecode_model::Error::io(path, e))
        .with_context(|| what.to_string())?;
    #[cfg(unix)]
    let runnable = {
        use std::os::unix::fs::PermissionsExt;
        m.is_file() && m.permissions().mode() & 0o111 != 0
    };
    #[cfg(not(unix))]
    let runnable = m.is_file();
    if !runnable {
        bail!(
            "{what}: {}: is {}, not an executable file",
            path.display(),
            if m.is_file() {
                "a file without execute permission"
            } else {
                fastdecode_model::files::kind(&m.file_type())
            }
        );
    }
    std::path::absolute(path).with_context(|| format!("{what}: {}", path.display()))
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
                .map_err(|e| fastdecode_model::Error::io(p, e))?
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
        fastdecode_model::files::create_dirs(d)?;
    }
    fastdecode_model::checkpoint::write_atomic(path, text.as_bytes())?;
    Ok(())
}

/// A draft source option: `drafter` or `oracle:P`, kept as written.
pub fn draft_source(s: &str) -> std::result::Result<String, String> {
    s.parse::<fastdecode_engine::DraftSpec>()?;
    Ok(s.to_string())
}

/// A progress bar of `len` steps (pairs, goldens) named `what`, its message after the count.
pub fn bar(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(&format!("{what} [{{bar:30}}] {{pos}}/{{len}} {{msg}}"))
            .expect("static template")
            .progress_chars("=> "),
    );
    pb
}
