//! One error type for everything a user can hand the model layer: configs, checkpoints, manifests.
//! Messages always name the file, tensor or field at fault.

use std::path::{Path, PathBuf};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config: {0}")]
    Config(String),
    #[error("{file}: {inner}")]
    InFile { file: PathBuf, inner: Box<Error> },
    #[error("tensor {tensor}: {msg}")]
    Tensor { tensor: String, msg: String },
    #[error("{0}")]
    Checkpoint(String),
    #[error("manifest: {0}")]
    Manifest(String),
    /// Bad arguments to an engine call (token ids, positions, layer ids).
    #[error("{0}")]
    Input(String),
    /// A compute backend failed (GPU driver, kernel launch, device memory).
    #[error("backend: {0}")]
    Backend(String),
}

impl Error {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }
    pub fn field(name: &str, msg: impl std::fmt::Display) -> Self {
        Error::Config(format!("field `{name}` {msg}"))
    }
    pub fn tensor(name: &str, msg: impl std::fmt::Display) -> Self {
        Error::Tensor {
            tensor: name.to_string(),
            msg: msg.to_string(),
        }
    }
    pub fn in_file(self, file: &Path) -> Self {
        match self {
            e @ (Error::Io { .. } | Error::InFile { .. }) => e,
            e => Error::InFile {
                file: file.to_path_buf(),
                inner: Box::new(e),
            },
        }
    }
}
