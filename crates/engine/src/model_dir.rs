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
}

impl LoadedModel {
    pub fn load(dir: &Path) -> Result<Self> {
        if !dir.join("config.json").is_file() {
            return Err(Error::Checkpoint(format!(
                "{}: not a model directory (no config.json)",
                dir.display()
            )));
        }
        let target = Arc::new(TargetModel::load(dir)?);
        let ddir = dir.join("drafter");
        let drafter = if ddir.join("config.json").is_file() {
            let d = DrafterModel::load(&ddir)?;
            d.cfg
                .check_target(&target.cfg)
                .map_err(|e| e.in_file(&ddir.join("config.json")))?;
            Some(Arc::new(d))
        } else {
            None
        };
        let tp = dir.join("tokenizer.json");
        let tokenizer = if tp.is_file() {
            Some(TextTokenizer::load(&tp)?)
        } else {
            None
        };
        Ok(LoadedModel {
            dir: dir.to_path_buf(),
            target,
            drafter,
            tokenizer,
        })
    }

    pub fn layout(&self) -> Layout {
        Layout::of(&self.target.cfg)
    }
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

/// The model used when no `--model` is given: the trained pair under `assets/` when this is a
/// checkout that has it, else a `tiny` synthetic model made once (seed 0) in the cache directory.
pub fn default_model_dir() -> Result<PathBuf> {
    let candidates = [
        PathBuf::from("assets").join(BUNDLED),
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../assets")
            .join(BUNDLED),
    ];
    for c in candidates {
        if c.join("config.json").is_file() {
            return Ok(c);
        }
    }
    let dir = cache_root().join("tiny-seed0");
    if !dir.join("MANIFEST").is_file() {
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        }
        eprintln!(
            "fastdecode: making the default tiny synthetic model in {}",
            dir.display()
        );
        let preset = fastdecode_model::synth::preset("tiny")?;
        fastdecode_model::synth::write_synthetic(
            &dir,
            &preset,
            0,
            Layout::Runtime,
            &indicatif::ProgressBar::hidden(),
        )?;
    }
    Ok(dir)
}
