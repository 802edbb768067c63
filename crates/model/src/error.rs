//! One error type for everything a user can hand the model layer: configs, checkpoints, manifests.
//! Messages always name the file, tensor or field at fault.

use std::path::{Path, PathBuf};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The OS error is part of the message, not a `source`: a report printing the error chain
    /// would otherwise say it twice.
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    /// A file or directory that is not what it must be (a FIFO, too large, already there, ...).
    #[error("{path}: {msg}")]
    File { path: PathBuf, msg: String },
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
    pub fn io(path: &Path, err: std::io::Error) -> Self {
        Error::Io {
            path: path.to_path_buf(),
            err,
        }
    }
    pub fn file(path: &Path, msg: impl std::fmt::Display) -> Self {
        Error::File {
            path: path.to_path_buf(),
            msg: msg.to_string(),
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
            e @ (Error::Io { .. } | Error::File { .. } | Error::InFile { .. }) => e,
            e => Error::InFile {
                file: file.to_path_buf(),
                inner: Box::new(e),
            },
        }
    }
}
