//! Everything fastdecode reads and writes about a Laguna model: configs, tensor inventories,
//! safetensors checkpoints in the HF and NVFP4 runtime layouts, the NVFP4 codec, manifests,
//! synthetic checkpoints and the HF → runtime transform.

pub mod checkpoint;
pub mod config;
pub mod error;
pub mod files;
pub mod inventory;
pub mod manifest;
pub mod nvfp4;
pub mod rope;
pub mod synth;
pub mod tokenizer;
pub mod transform;

pub use config::{DrafterConfig, LagunaConfig, LayerType, MlpType};
pub use error::{Error, Result};
pub use inventory::Layout;

/// Test fixtures that live in this crate, so its tests need nothing outside the repository.
#[cfg(test)]
pub(crate) mod fixtures {
    use std::path::PathBuf;

    /// One of Laguna XS 2.1's released config files (`config.json`, `dflash-config.json`): the
    /// `xs2.1` preset's copies, which `synth`'s tests pin byte for byte by their sha256.
    pub(crate) fn xs21(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("presets/xs2.1")
            .join(name)
    }
}
