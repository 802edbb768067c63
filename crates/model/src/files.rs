//! Files as fastdecode reads and writes them.
//!
//! Reading: an input must be a regular file (a FIFO would block forever, a device never end) of a
//! bounded size; it is opened without blocking and its type is checked on the open handle, so a
//! file swapped for a FIFO between a check and the open cannot hang the reader either.
//!
//! Writing: every output goes to a temporary name that is unique to this run (in the
//! destination's own directory, so the final rename never crosses file systems) and is renamed
//! into place when complete. Two runs writing the same destination never share a temporary, a
//! failed run removes only the temporary it created, and a destination directory that exists is
//! never replaced. While it exists a temporary is listed (`Partial`), so a run stopped by a
//! signal removes what it was writing (`remove_partial_outputs`) rather than leaving it.

use std::ffi::OsString;
use std::fs::{File, Metadata, OpenOptions};
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use crate::error::{Error, Result};

/// Largest text input read whole (configs, tokenizers, manifests, goldens, prompt files): far
/// above any real one, it keeps a wrong path (a disk image, a checkpoint) from filling memory.
pub const MAX_TEXT_BYTES: u64 = 256 << 20;

/// What kind of file system entry `t` is, for messages.
pub fn kind(t: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if t.is_socket() {
            return "a socket";
        }
        if t.is_block_device() || t.is_char_device() {
            return "a device";
        }
    }
    if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_file() {
        "a regular file"
    } else {
        "not a regular file"
    }
}

/// Opens `path` (following symbolic links) for reading, if it is a regular file. The open never
/// blocks, whatever the entry is.
pub fn open_regular(path: &Path) -> Result<File> {
    let mut o = OpenOptions::new();
    o.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Opening a FIFO for reading waits for a writer unless O_NONBLOCK; on a regular file the
        // flag changes nothing.
        o.custom_flags(libc::O_NONBLOCK);
    }
    let f = o.open(path).map_err(|e| Error::io(path, e))?;
    let meta = f.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(Error::file(
            path,
            format!("is {}, not a regular file", kind(&meta.file_type())),
        ));
    }
    Ok(f)
}

/// The bytes of the regular file `path`, refusing one larger than `limit`.
pub fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>> {
    let f = open_regular(path)?;
    let len = f.metadata().map_err(|e| Error::io(path, e))?.len();
    if len > limit {
        return Err(Error::file(
            path,
            format!("is {len} bytes, more than the {limit} bytes such a file may have"),
        ));
    }
    let mut buf = Vec::with_capacity(len as usize);
    // `take` also bounds a file that grows while it is read.
    f.take(limit + 1)
        .read_to_end(&mut buf)
        .map_err(|e| Error::io(path, e))?;
    if buf.len() as u64 > limit {
        return Err(Error::file(
            path,
            "grew past its size limit while it was read",
        ));
    }
    Ok(buf)
}

/// The UTF-8 text of the regular file `path` (at most `MAX_TEXT_BYTES`).
pub fn read_text(path: &Path) -> Result<String> {
    let bytes = read_bounded(path, MAX_TEXT_BYTES)?;
    String::from_utf8(bytes).map_err(|e| {
        Error::file(
            path,
            format!("is not UTF-8 text (byte {})", e.utf8_error().valid_up_to()),
        )
    })
}

/// The directory a new entry `path` goes into (`.` for a bare name).
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Creates `dir` and its parents. When an existing part of the path is not a directory, the
/// error names that part (the OS says only "File exists" or "Not a directory").
pub fn create_dirs(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| {
        for a in dir.ancestors() {
            if let Ok(m) = a.metadata() {
                if !m.is_dir() {
                    let mut msg = format!("is {}, not a directory", kind(&m.file_type()));
                    if a != dir {
                        msg += &format!(", so {} cannot be created", dir.display());
                    }
                    return Error::file(a, msg);
                }
                break;
            }
        }
        Error::io(dir, e)
    })
}

/// `.NAME.`: temporaries are `.NAME.XXXXXX.partial`, hidden, unique to this run, and
/// recognisable as an unfinished write (`manifest::write` refuses to pin one).
fn temp_prefix(path: &Path) -> OsString {
    let mut prefix = OsString::from(".");
    prefix.push(path.file_name().unwrap_or_default());
    prefix.push(".");
    prefix
}

/// A new temporary file in `dir` for the destination `path`.
fn temp_file(path: &Path, dir: &Path) -> Result<tempfile::NamedTempFile> {
    let prefix = temp_prefix(path);
    let mut b = tempfile::Builder::new();
    b.prefix(&prefix).suffix(".partial");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        // The umask decides, as for any file the user writes (tempfile's default is 0600).
        b.permissions(std::fs::Permissions::from_mode(0o666));
    }
    b.tempfile_in(dir).map_err(|e| Error::io(dir, e))
}

/// A new temporary directory in `dir` for the destination `path`.
fn temp_dir(path: &Path, dir: &Path) -> Result<tempfile::TempDir> {
    let prefix = temp_prefix(path);
    tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".partial")
        .tempdir_in(dir)
        .map_err(|e| Error::io(dir, e))
}

/// The temporaries this process is writing now: a signal ends a process without running the
/// destructors that would remove them.
static PARTIAL: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn partial_outputs() -> MutexGuard<'static, Vec<PathBuf>> {
    PARTIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A temporary's place in `PARTIAL` for as long as this guard lives.
struct Partial(PathBuf);

impl Partial {
    fn new(path: &Path) -> Partial {
        partial_outputs().push(path.to_path_buf());
        Partial(path.to_path_buf())
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        let mut all = partial_outputs();
        if let Some(i) = all.iter().position(|p| *p == self.0) {
            all.swap_remove(i);
        }
    }
}

/// Removes every temporary this process is writing and returns how many there were: what a
/// signal handler does before the process ends. The list stays locked after it, so no new
/// temporary is listed (or left) behind it.
pub fn remove_partial_outputs() -> usize {
    let all = partial_outputs();
    for p in all.iter() {
        let _ = std::fs::remove_dir_all(p).or_else(|_| std::fs::remove_file(p));
    }
    let n = all.len();
    std::mem::forget(all);
    n
}

/// Writes `path` through a temporary file of its own directory: `fill` writes the temporary (by
/// path), which is renamed over `path` once `fill` succeeds and removed if it fails.
pub fn write_through(path: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let dir = parent_of(path);
    let tmp = temp_file(path, dir)?;
    let _listed = Partial::new(tmp.path());
    fill(tmp.path())?;
    tmp.persist(path).map_err(|e| Error::io(path, e.error))?;
    Ok(())
}

/// Writes small files (configs, manifests, reports) atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_through(path, |tmp| {
        let mut f = OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(tmp)
            .map_err(|e| Error::io(tmp, e))?;
        f.write_all(bytes).map_err(|e| Error::io(path, e))
    })
}

/// `path` made absolute with its existing part resolved (symbolic links, `..`), so two paths can
/// be compared for containment before the later part exists.
pub fn resolve(path: &Path) -> Result<PathBuf> {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| Error::io(Path::new("."), e))?
            .join(path)
    };
    let mut existing = abs.as_path();
    let mut rest = vec![];
    loop {
        if existing.symlink_metadata().is_ok() {
            break;
        }
        match (existing.parent(), existing.file_name()) {
            (Some(p), Some(n)) => {
                rest.push(n.to_os_string());
                existing = p;
            }
            _ => break,
        }
    }
    let mut out = existing
        .canonicalize()
        .map_err(|e| Error::io(existing, e))?;
    for n in rest.into_iter().rev() {
        out.push(n);
    }
    Ok(out)
}

/// Refuses an output `out` that would write over or into the input `input` (`what` names it):
/// the same file (through `..`, a symbolic link or a hard link), a path inside the input
/// directory (which would change it under its own MANIFEST), or a directory holding the input.
pub fn refuse_overlap(out: &Path, input: &Path, what: &str) -> Result<()> {
    let Ok(inp) = input.canonicalize() else {
        return Ok(());
    };
    let o = resolve(out)?;
    let why = if o == inp || same_inode(&o, &inp) {
        "is the same file as"
    } else if o.starts_with(&inp) {
        "is inside"
    } else if inp.starts_with(&o) {
        "holds"
    } else {
        return Ok(());
    };
    Err(Error::file(
        out,
        format!(
            "{why} the {what} {}: writing there would destroy or change it; choose an output apart from every input",
            input.display()
        ),
    ))
}

/// Whether `a` and `b` both exist and are one file (a hard link has its own path).
fn same_inode(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(x), Ok(y)) = (a.metadata(), b.metadata()) {
            return x.dev() == y.dev() && x.ino() == y.ino();
        }
    }
    let _ = (a, b);
    false
}

/// Checks that `out` can be a new directory: its last component is a name (not `.`, `..` or a
/// root) and nothing exists there yet (not even a dangling link); with `allow_empty`, an
/// existing empty directory is accepted too.
pub fn check_new_dir(out: &Path, allow_empty: bool) -> Result<()> {
    if !matches!(out.components().next_back(), Some(Component::Normal(_))) {
        return Err(Error::file(
            out,
            "does not name a new directory (its last part must be a name, not `.`, `..` or `/`)",
        ));
    }
    match out.symlink_metadata() {
        Err(_) => {}
        Ok(m) if allow_empty && m.is_dir() => {
            let mut rd = std::fs::read_dir(out).map_err(|e| Error::io(out, e))?;
            if rd.next().is_some() {
                return Err(Error::file(
                    out,
                    "already exists and is not empty; choose a new (or empty) output directory",
                ));
            }
        }
        Ok(m) => {
            let what = if m.is_dir() {
                "a directory".to_string()
            } else {
                kind(&m.file_type()).to_string()
            };
            return Err(Error::file(
                out,
                format!("already exists ({what}); choose a new output directory"),
            ));
        }
    }
    Ok(())
}

/// A directory being written under a temporary name beside its destination; `commit` renames it
/// into place, dropping it uncommitted removes it (only it: it is this run's own).
pub struct StagedDir {
    tmp: tempfile::TempDir,
    out: PathBuf,
    _listed: Partial,
}

impl StagedDir {
    /// Stages a new directory `out` (see `check_new_dir`), creating `out`'s parents.
    pub fn new(out: &Path, allow_empty: bool) -> Result<StagedDir> {
        check_new_dir(out, allow_empty)?;
        let dir = parent_of(out);
        create_dirs(dir)?;
        let tmp = temp_dir(out, dir)?;
        let _listed = Partial::new(tmp.path());
        Ok(StagedDir {
            tmp,
            out: out.to_path_buf(),
            _listed,
        })
    }

    pub fn path(&self) -> &Path {
        self.tmp.path()
    }

    /// Renames the staged directory to its destination. A rename replaces at most an empty
    /// directory, so a destination another run completed meanwhile is refused, never replaced.
    pub fn commit(self) -> Result<()> {
        match std::fs::rename(self.tmp.path(), &self.out) {
            Ok(()) => {
                // Renamed away: nothing is left for the guard to remove.
                let _ = self.tmp.keep();
                Ok(())
            }
            Err(e) if self.out.symlink_metadata().is_ok() => Err(Error::file(
                &self.out,
                format!(
                    "appeared while this run was writing it (another run?) and was left as it \
                     is; this run's output is discarded ({e})"
                ),
            )),
            Err(e) => Err(Error::io(&self.out, e)),
        }
    }
}

/// Creates the new directory `out` through a staging directory renamed into place once `fill`
/// has completed it, so a failed or interrupted run never leaves a half-written directory under
/// the final name.
pub fn with_staging_dir(out: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let s = StagedDir::new(out, false)?;
    fill(s.path())?;
    s.commit()
}

/// Checks, before a long run, that a report can be written to `path` later: it is not a
/// directory, and its directory exists (it is created) and takes a new file.
pub fn check_output_file(path: &Path) -> Result<()> {
    if path.as_os_str().is_empty() || path.file_name().is_none() {
        return Err(Error::file(path, "does not name a file"));
    }
    if let Ok(m) = path.metadata() {
        if !m.is_file() {
            return Err(Error::file(
                path,
                format!("is {}; give a file name", kind(&m.file_type())),
            ));
        }
    }
    let dir = parent_of(path);
    create_dirs(dir)?;
    temp_file(path, dir)?;
    Ok(())
}

/// Checks, before a long write, that the file system holding the new entry `out` has room for
/// `bytes` more (where the OS says how much it has).
pub fn check_free_space(out: &Path, bytes: u64) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        // The nearest existing directory is where the bytes will go.
        let Some(dir) = parent_of(out).ancestors().find(|a| a.is_dir()) else {
            return Ok(());
        };
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
            return Ok(());
        };
        // SAFETY: statvfs fills the zeroed plain-data struct it is given.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
            return Ok(());
        }
        let free = (st.f_bavail as u64).saturating_mul(st.f_frsize as u64);
        if free < bytes {
            let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
            return Err(Error::file(
                out,
                format!(
                    "needs about {:.2} GiB, but {} has {:.2} GiB free",
                    gib(bytes),
                    dir.display(),
                    gib(free)
                ),
            ));
        }
    }
    Ok(())
}

/// (device, inode) of an entry, to tell whether a path still names the file that was opened.
#[cfg(unix)]
pub fn identity(m: &Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino())
}

#[cfg(not(unix))]
pub fn identity(m: &Metadata) -> (u64, u64) {
    (m.len(), 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_names_are_unique_and_failures_remove_only_their_own() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("o");
        // Someone's own `o.partial` (the old fixed staging name) is never touched.
        std::fs::create_dir(d.path().join("o.partial")).unwrap();
        std::fs::write(d.path().join("o.partial/keep"), b"mine").unwrap();
        let a = StagedDir::new(&out, false).unwrap();
        let b = StagedDir::new(&out, false).unwrap();
        assert_ne!(a.path(), b.path());
        std::fs::write(a.path().join("x"), b"a").unwrap();
        std::fs::write(b.path().join("x"), b"b").unwrap();
        a.commit().unwrap();
        let e = b.commit().unwrap_err().to_string();
        assert!(e.contains("appeared while this run was writing"), "{e}");
        assert_eq!(std::fs::read(out.join("x")).unwrap(), b"a");
        assert_eq!(
            std::fs::read(d.path().join("o.partial/keep")).unwrap(),
            b"mine"
        );
        let left: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left.len(), 2, "{left:?}");
        for bad in ["x/..", ".", "/"] {
            let e = check_new_dir(Path::new(bad), false)
                .unwrap_err()
                .to_string();
            assert!(e.contains("does not name a new directory"), "{bad}: {e}");
        }
    }

    #[test]
    fn outputs_inside_inputs_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let inp = d.path().join("in");
        std::fs::create_dir(&inp).unwrap();
        let e = refuse_overlap(&inp.join("a/b"), &inp, "model directory")
            .unwrap_err()
            .to_string();
        assert!(e.contains("is inside the model directory"), "{e}");
        refuse_overlap(&d.path().join("out"), &inp, "model directory").unwrap();
        // Through `..` and a link, the same place is recognised.
        std::os::unix::fs::symlink(&inp, d.path().join("link")).unwrap();
        assert!(refuse_overlap(&d.path().join("link/x"), &inp, "m").is_err());
        assert!(refuse_overlap(&inp.join("../in/x"), &inp, "m").is_err());
        // The input itself, by any name (a hard link too), and a directory holding it.
        let f = inp.join("t.csv");
        std::fs::write(&f, "x").unwrap();
        std::fs::hard_link(&f, d.path().join("hard")).unwrap();
        for same in [
            f.clone(),
            d.path().join("link/t.csv"),
            d.path().join("hard"),
        ] {
            let e = refuse_overlap(&same, &f, "trace").unwrap_err().to_string();
            assert!(e.contains("is the same file as the trace"), "{same:?}: {e}");
        }
        let e = refuse_overlap(d.path(), &f, "trace")
            .unwrap_err()
            .to_string();
        assert!(e.contains("holds the trace"), "{e}");
        refuse_overlap(&inp.join("u.csv"), &f, "trace").unwrap();
    }
}
