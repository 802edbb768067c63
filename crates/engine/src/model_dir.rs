//! A model directory (`config.json`, `*.safetensors`, optional `tokenizer.json`, optional
//! `drafter/`), loaded for the CPU backend; and the bundled default model.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fastdecode_cpu::{DrafterModel, TargetModel};
use fastdecode_model::inventory::Layout;
use fastdecode_model::{Error, Result};

use crate::tokenizer::TextTokenizer;

pub struct LoadedModel {
    pub dir: PathBuf,
    pub target: Arc<TargetModel>,
    pub drafter: Option<Arc<DrafterModel>>,
    pub tokenizer: Option<TextTokenizer>,
    /// Optional parts that are present but could not be loaded, and were left out because the
    /// run does not need them (`load_for`): one message each, naming the file and why.
    pub ignored: Vec<String>,
}

/// Which optional parts of a model directory a run needs: a needed part that is present must
/// load; one that is not needed is left out, with a note, when it is broken.
#[derive(Debug, Clone, Copy)]
pub struct Needs {
    pub drafter: bool,
    pub tokenizer: bool,
}

impl Needs {
    pub const ALL: Needs = Needs {
        drafter: true,
        tokenizer: true,
    };
}

impl LoadedModel {
    /// Loads the target and every optional part present (a drafter, a tokenizer); any of them
    /// that is broken is an error naming its file.
    pub fn load(dir: &Path) -> Result<Self> {
        Self::load_for(dir, Needs::ALL)
    }

    /// Loads the target and the optional parts present; a broken part the run `needs` is an
    /// error, one it does not need is left out and named in `ignored`.
    pub fn load_for(dir: &Path, needs: Needs) -> Result<Self> {
        require_config(dir)?;
        let target = Arc::new(TargetModel::load(dir)?);
        let mut ignored = vec![];
        let drafter = optional(
            needs.drafter,
            load_drafter(&dir.join("drafter"), &target),
            &mut ignored,
        )?;
        let tp = dir.join("tokenizer.json");
        let tokenizer = match tp.symlink_metadata() {
            Err(_) => Ok(None),
            Ok(_) => TextTokenizer::load(&tp, target.cfg.vocab_size).map(Some),
        };
        let tokenizer = optional(needs.tokenizer, tokenizer, &mut ignored)?;
        Ok(LoadedModel {
            dir: dir.to_path_buf(),
            target,
            drafter: drafter.map(Arc::new),
            tokenizer,
            ignored,
        })
    }

    pub fn layout(&self) -> Layout {
        Layout::of(&self.target.cfg)
    }
}

/// Checks that `dir` looks like a model directory: it has a `config.json` (whether that is a
/// readable config is for its reader to say).
pub fn require_config(dir: &Path) -> Result<()> {
    if dir.join("config.json").symlink_metadata().is_err() {
        return Err(Error::Checkpoint(format!(
            "{}: not a model directory (no config.json)",
            dir.display()
        )));
    }
    Ok(())
}

/// A loaded optional part; a broken one the run does not need becomes a note in `ignored`.
fn optional<T>(
    needed: bool,
    part: Result<Option<T>>,
    ignored: &mut Vec<String>,
) -> Result<Option<T>> {
    match part {
        Err(e) if !needed => {
            ignored.push(format!("{e}; not needed by this run, so it is left out"));
            Ok(None)
        }
        other => other,
    }
}

/// The drafter in `ddir`, if there is one (`ddir` missing: none). A `drafter/` without a config,
/// or one that does not fit the target, is an error naming it.
fn load_drafter(ddir: &Path, target: &TargetModel) -> Result<Option<DrafterModel>> {
    if ddir.symlink_metadata().is_err() {
        return Ok(None);
    }
    let dc = ddir.join("config.json");
    if !dc.is_file() {
        return Err(Error::Checkpoint(format!(
            "{}: a drafter directory without a config.json",
            ddir.display()
        )));
    }
    let d = DrafterModel::load(ddir)?;
    d.cfg
        .check_target(&target.cfg)
        .map_err(|e| e.in_file(&dc))?;
    Ok(Some(d))
}

/// Name of the trained bundled model under `assets/`.
pub const BUNDLED: &str = "laguna-tiny";

fn cache_root() -> PathBuf {
    if let Some(h) = std::env::var_os("FASTDECODE_HOME") {
        return PathBuf::from(h);
    }
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(x).join("fastdecode");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".cache/fastdecode"),
        None => std::env::temp_dir().join("fastdecode"),
    }
}

/// The model used when no `--model` is given: the trained pair under `assets/` of the checkout
/// this binary was built in, or of a checkout it sits in (`target/release/`, `.gpu/`), else a
/// `tiny` synthetic model made once (seed 0) in the cache directory. The current directory is
/// not looked at: which model runs must not depend on where the command is typed.
pub fn default_model_dir() -> Result<PathBuf> {
    let mut candidates = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")];
    if let Ok(exe) = std::env::current_exe() {
        candidates.extend(exe.ancestors().skip(1).take(3).map(Path::to_path_buf));
    }
    for c in candidates {
        let dir = c.join("assets").join(BUNDLED);
        if dir.join("config.json").is_file() {
            return Ok(dir);
        }
    }
    let dir = cache_root().join("tiny-seed0");
    if !dir.join("MANIFEST").is_file() {
        if let Some(parent) = dir.parent() {
            fastdecode_model::files::create_dirs(parent)?;
        }
        eprintln!(
            "fastdecode: making the default tiny synthetic model in {}",
            dir.display()
        );
        let preset = fastdecode_model::synth::preset("tiny")?;
        let made = fastdecode_model::synth::write_synthetic(
            &dir,
            &preset,
            0,
            Layout::Runtime,
            &indicatif::ProgressBar::hidden(),
        );
        // Another process making it at the same moment is as good as making it here.
        if let Err(e) = made {
            if !dir.join("MANIFEST").is_file() {
                return Err(e);
            }
        }
    }
    Ok(dir)
}
