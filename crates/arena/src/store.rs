//! The service's files beside its database: the artifact store (bundles and built binaries,
//! each named by its sha256) and the hidden store (hidden material, named by digest, never
//! served to anyone but runners).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::bundle::{digest, is_digest};

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

/// The bytes of a file a user named (a track, a case, a patch, a note). It is opened without
/// waiting (a FIFO with no writer would block the open itself) and the opened handle must be a
/// regular file: a FIFO, a device or a socket is refused by name, never read or waited on.
pub fn read_regular(path: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .with_context(|| path.display().to_string())?;
    let t = f
        .metadata()
        .with_context(|| path.display().to_string())?
        .file_type();
    if !t.is_file() {
        let kind = if t.is_dir() {
            "a directory"
        } else if t.is_fifo() {
            "a FIFO"
        } else if t.is_socket() {
            "a socket"
        } else if t.is_char_device() || t.is_block_device() {
            "a device"
        } else {
            "not a plain file"
        };
        bail!("{}: {kind}, not a regular file", path.display());
    }
    let mut out = vec![];
    f.read_to_end(&mut out)
        .with_context(|| path.display().to_string())?;
    Ok(out)
}

/// [`read_regular`] as UTF-8 text.
pub fn read_regular_text(path: &Path) -> Result<String> {
    String::from_utf8(read_regular(path)?)
        .map_err(|_| anyhow::anyhow!("{}: not UTF-8 text", path.display()))
}

/// Writes `bytes` to `path` through a unique temporary name beside it (owner-only, as the
/// temporary file is made: what else the file may be is [`write_atomic_mode`]'s).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_mode(path, bytes, 0o600)
}

/// Writes `bytes` to `path` with permissions `mode`: the temporary file beside it gets its
/// mode and is closed before it is renamed into place, so whoever opens or runs `path` finds it
/// whole, with its mode, and open for writing by nobody (an executable still open for writing
/// cannot be run: ETXTBSY).
pub fn write_atomic_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().context("a file in a directory")?;
    std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    let mut tmp =
        tempfile::NamedTempFile::new_in(dir).with_context(|| dir.display().to_string())?;
    std::io::Write::write_all(&mut tmp, bytes).with_context(|| path.display().to_string())?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))
        .with_context(|| path.display().to_string())?;
    tmp.into_temp_path()
        .persist(path)
        .map_err(|e| e.error)
        .with_context(|| path.display().to_string())?;
    Ok(())
}

/// Keeps `bytes` at `path`, named by their digest, with `mode`, unless a file is there already:
/// what a digest names never changes, and a file another process may be running (a runner's
/// cache is shared) is never replaced under it. A file there with another mode (left by an
/// earlier version, which set it after the rename) gets `mode` in place: the same inode, so
/// nothing running it is disturbed.
///
/// `bytes` is called only when no file is there (a download, for a runner's artifact).
pub fn keep_by_digest(
    path: &Path,
    mode: u32,
    bytes: impl FnOnce() -> Result<Vec<u8>>,
) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => {
            if m.permissions().mode() & 0o7777 != mode {
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                    .with_context(|| path.display().to_string())?;
            }
            Ok(())
        }
        _ => write_atomic_mode(path, &bytes()?, mode),
    }
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
        // Owner-only, as write_atomic keeps every file of the service's.
        keep_by_digest(&self.path("artifacts", &d)?, 0o600, || Ok(bytes.to_vec()))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// `f`'s value, or a failed test if it takes more than a few seconds (a wait on a FIFO).
    fn promptly<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(5))
            .expect("it waits on the FIFO instead of refusing it")
    }

    fn fifo(p: &Path) {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
    }

    /// A runner's cached binary may be running in another runner's worker: it is written
    /// whole with its mode before it appears, and never replaced once there. (Replaced by a
    /// reproducible build of another submission through an owner-only temporary file, a worker
    /// of the sandbox's user starting meanwhile failed: "setpriv: failed to execute …:
    /// Permission denied".)
    #[test]
    fn a_kept_artifact_appears_with_its_mode_and_is_never_replaced() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("artifacts/sha256-x");
        keep_by_digest(&p, 0o755, || Ok(b"#!/bin/sh\n".to_vec())).unwrap();
        let first = std::fs::metadata(&p).unwrap();
        assert_eq!(first.permissions().mode() & 0o777, 0o755);
        keep_by_digest(&p, 0o755, || panic!("fetched again")).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().ino(), first.ino());
        // One left owner-only (by an earlier version, or a runner killed mid-write) gets its
        // mode back, in place.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        keep_by_digest(&p, 0o755, || panic!("fetched again")).unwrap();
        let again = std::fs::metadata(&p).unwrap();
        assert_eq!(
            (again.ino(), again.permissions().mode() & 0o777),
            (first.ino(), 0o755)
        );
        // Nothing is left beside it: the temporary name went with the rename.
        assert_eq!(
            std::fs::read_dir(d.path().join("artifacts"))
                .unwrap()
                .count(),
            1
        );
        // A plain write keeps its owner-only mode.
        let secret = d.path().join("secret");
        write_atomic(&secret, b"s").unwrap();
        let mode = std::fs::metadata(&secret).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_fifo_a_device_or_a_directory_is_refused_by_name() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("note.md");
        fifo(&f);
        let e = promptly(move || read_regular(&f).unwrap_err());
        assert!(
            format!("{e:#}").contains("note.md: a FIFO, not a regular file"),
            "{e:#}"
        );
        let e = read_regular(Path::new("/dev/zero")).unwrap_err();
        assert!(format!("{e:#}").contains("/dev/zero: a device"), "{e:#}");
        let e = read_regular(d.path()).unwrap_err();
        assert!(format!("{e:#}").contains("a directory"), "{e:#}");
        let ok = d.path().join("ok");
        std::fs::write(&ok, "text").unwrap();
        assert_eq!(read_regular_text(&ok).unwrap(), "text");
    }

    #[test]
    fn a_fifo_among_the_tracks_is_refused_by_name() {
        let d = tempfile::tempdir().unwrap();
        fifo(&d.path().join("x.toml"));
        let dir = d.path().to_path_buf();
        let e = promptly(move || crate::track::load_dir(&dir).unwrap_err());
        assert!(format!("{e:#}").contains("x.toml: a FIFO"), "{e:#}");
    }

    #[test]
    fn a_fifo_among_the_red_team_cases_is_refused_by_name() {
        let d = tempfile::tempdir().unwrap();
        fifo(&d.path().join("case.toml"));
        let dir = d.path().to_path_buf();
        let e = promptly(move || crate::client::redteam::load(&dir).unwrap_err());
        assert!(format!("{e:#}").contains("case.toml: a FIFO"), "{e:#}");
    }

    #[test]
    fn a_fifo_as_the_note_file_is_refused_by_name() {
        let d = tempfile::tempdir().unwrap();
        let note = d.path().join("note.md");
        fifo(&note);
        let o = crate::client::SubmitOptions {
            server: "http://127.0.0.1:9".into(),
            token: "t".into(),
            track: "serial-tiny".into(),
            note_file: note,
            model: None,
            claimed_score: None,
            repo: d.path().to_path_buf(),
            idempotency_key: None,
            mode: crate::api::Mode::Leaderboard,
            local_result: None,
        };
        let e = promptly(move || crate::client::submit(&o).unwrap_err());
        assert!(
            format!("{e:#}").contains("--note-file")
                && format!("{e:#}").contains("note.md: a FIFO"),
            "{e:#}"
        );
    }
}
