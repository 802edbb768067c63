//! The service's files beside its database: the artifact store (bundles and built binaries,
//! each named by its sha256) and the hidden store (hidden material, named by digest, never
//! served to anyone but runners).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::bundle::digest;
use crate::track::is_digest;

#[derive(Clone)]
pub struct Store {
    pub root: PathBuf,
}

fn file_name(d: &str) -> Result<String> {
    if !is_digest(d) {
        bail!("{d:?} is not a sha256:… digest");
    }
    Ok(d.replacen(':', "-", 1))
}

/// Writes `bytes` to `path` through a unique temporary name beside it.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().context("a file in a directory")?;
    std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    let mut tmp =
        tempfile::NamedTempFile::new_in(dir).with_context(|| dir.display().to_string())?;
    std::io::Write::write_all(&mut tmp, bytes).with_context(|| path.display().to_string())?;
    tmp.persist(path)
        .map_err(|e| e.error)
        .with_context(|| path.display().to_string())?;
    Ok(())
}

impl Store {
    pub fn new(root: &Path) -> Store {
        Store {
            root: root.to_path_buf(),
        }
    }

    fn path(&self, area: &str, d: &str) -> Result<PathBuf> {
        Ok(self.root.join(area).join(file_name(d)?))
    }

    /// Keeps `bytes` as an artifact; returns its digest.
    pub fn put_artifact(&self, bytes: &[u8]) -> Result<String> {
        let d = digest(bytes);
        let p = self.path("artifacts", &d)?;
        if !p.is_file() {
            write_atomic(&p, bytes)?;
        }
        Ok(d)
    }

    pub fn artifact(&self, d: &str) -> Result<Option<Vec<u8>>> {
        read_opt(&self.path("artifacts", d)?)
    }

    pub fn put_hidden(&self, bytes: &[u8]) -> Result<String> {
        let d = digest(bytes);
        let p = self.path("hidden", &d)?;
        if !p.is_file() {
            write_atomic(&p, bytes)?;
        }
        Ok(d)
    }

    pub fn hidden(&self, d: &str) -> Result<Option<Vec<u8>>> {
        read_opt(&self.path("hidden", d)?)
    }
}

fn read_opt(p: &Path) -> Result<Option<Vec<u8>>> {
    match std::fs::read(p) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| p.display().to_string()),
    }
}
