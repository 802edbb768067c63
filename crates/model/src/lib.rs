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
