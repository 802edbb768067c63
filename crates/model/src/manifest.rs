//! `MANIFEST`: one line per file of a checkpoint directory, `<sha256> <bytes> <relative path>`,
//! sorted by path. Its own sha256 is the digest that pins the whole directory.

use std::io::Read;
use std::path::{Path, PathBuf};

use indicatif::ProgressBar;
use sha2::{Digest, Sha256};

use crate::checkpoint::write_atomic;
use crate::error::{Error, Result};

pub const MANIFEST: &str = "MANIFEST";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub sha256: String,
    pub bytes: u64,
    pub path: String,
}

/// What `verify` checked.
#[derive(Debug)]
pub struct Verified {
    pub files: usize,
    pub bytes: u64,
    /// sha256 of the MANIFEST file: one digest for the whole directory.
    pub digest: String,
}

/// Where the entry `p` under the (canonical) `root` leads: itself when it is a regular file, the
/// file a symbolic link points to when that is a regular file inside `root`. Anything else (a
/// link out of the directory or to a directory, a FIFO, a socket, a device) is an error naming
/// `p`: a MANIFEST pins the files of one directory, and hashing must neither leave it nor block.
fn regular_inside(root: &Path, p: &Path) -> Result<()> {
    let m = p.symlink_metadata().map_err(|e| Error::io(p, e))?;
    if m.is_file() {
        return Ok(());
    }
    if !m.file_type().is_symlink() {
        return Err(Error::file(
            p,
            format!(
                "is {}; a model directory holds only regular files and directories",
                crate::files::kind(&m.file_type())
            ),
        ));
    }
    let target = p.canonicalize().map_err(|e| {
        Error::file(
            p,
            format!("is a symbolic link that cannot be followed: {e}"),
        )
    })?;
    if !target.starts_with(root) {
        return Err(Error::file(
            p,
            format!(
                "is a symbolic link to {}, outside {}; a MANIFEST pins only files inside its directory",
                target.display(),
                root.display()
            ),
        ));
    }
    let t = target.metadata().map_err(|e| Error::io(&target, e))?;
    if !t.is_file() {
        return Err(Error::file(
            p,
            format!(
                "is a symbolic link to {}, which is {}, not a regular file",
                target.display(),
                crate::files::kind(&t.file_type())
            ),
        ));
    }
    Ok(())
}

/// The directory's canonical path: containment is judged on resolved paths.
fn canonical_root(dir: &Path) -> Result<PathBuf> {
    let root = dir.canonicalize().map_err(|e| Error::io(dir, e))?;
    if !root.is_dir() {
        return Err(Error::file(dir, "is not a directory"));
    }
    Ok(root)
}

/// Every file under `dir` except MANIFEST, relative, `/`-separated, sorted; each one a regular
/// file inside `dir` (`regular_inside`). Names a MANIFEST line could not hold are refused.
fn relative_files(dir: &Path) -> Result<Vec<String>> {
    fn walk(root: &Path, base: &Path, d: &Path, out: &mut Vec<String>) -> Result<()> {
        for e in std::fs::read_dir(d).map_err(|e| Error::io(d, e))? {
            let e = e.map_err(|e| Error::io(d, e))?;
            let p = e.path();
            let ft = e.file_type().map_err(|e| Error::io(&p, e))?;
            if ft.is_dir() {
                walk(root, base, &p, out)?;
                continue;
            }
            regular_inside(root, &p)?;
            let rel = p.strip_prefix(base).expect("walked under base");
            let mut parts = vec![];
            for c in rel.components() {
                match c.as_os_str().to_str() {
                    Some(s) if !s.chars().any(char::is_control) => parts.push(s),
                    _ => return Err(Error::file(
                        &p,
                        "has a name that is not printable UTF-8, which a MANIFEST line cannot hold",
                    )),
                }
            }
            out.push(parts.join("/"));
        }
        Ok(())
    }
    let root = canonical_root(dir)?;
    let mut out = vec![];
    walk(&root, dir, dir, &mut out)?;
    out.retain(|p| p != MANIFEST);
    out.sort();
    Ok(out)
}

/// The sha256 and size of the file `path`, read once. A file that changes while it is read
/// (its size or modification time moves, or the path is replaced) is an error: its hash would
/// pin bytes that are no longer there.
fn hash_file(path: &Path, progress: &ProgressBar) -> Result<(String, u64)> {
    let mut f = crate::files::open_regular(path)?;
    let before = f.metadata().map_err(|e| Error::io(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
        progress.inc(k as u64);
    }
    let after = f.metadata().map_err(|e| Error::io(path, e))?;
    let now = path.metadata().map_err(|e| Error::io(path, e))?;
    let moved = n != before.len()
        || after.len() != before.len()
        || after.modified().ok() != before.modified().ok()
        || crate::files::identity(&now) != crate::files::identity(&before);
    if moved {
        return Err(Error::file(
            path,
            format!(
                "changed while it was being hashed ({} bytes when opened, {n} read, {} now); \
                 run again once nothing writes to it",
                before.len(),
                now.len()
            ),
        ));
    }
    Ok((hex::encode(h.finalize()), n))
}

pub fn render(entries: &[Entry]) -> String {
    entries
        .iter()
        .map(|e| format!("{} {} {}\n", e.sha256, e.bytes, e.path))
        .collect()
}

pub fn digest_of(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// Hashes every file under `dir` (except MANIFEST) and writes MANIFEST atomically. Returns the digest.
pub fn write(dir: &Path, progress: &ProgressBar) -> Result<String> {
    let files = relative_files(dir)?;
    let mut entries = vec![];
    for rel in files {
        if rel.ends_with(".partial") {
            return Err(Error::Manifest(format!(
                "{}: an unfinished write is lying in the directory",
                dir.join(&rel).display()
            )));
        }
        let (sha256, bytes) = hash_file(&dir.join(&rel), progress)?;
        entries.push(Entry {
            sha256,
            bytes,
            path: rel,
        });
    }
    let text = render(&entries);
    write_atomic(&dir.join(MANIFEST), text.as_bytes())?;
    Ok(digest_of(&text))
}

/// Parses MANIFEST text strictly; `file` names it in errors.
pub fn parse(text: &str, file: &Path) -> Result<Vec<Entry>> {
    let mut out: Vec<Entry> = vec![];
    for (i, line) in text.lines().enumerate() {
        let bad = |why: &str| {
            Error::Manifest(format!(
                "{} line {}: {why}: {line:?}",
                file.display(),
                i + 1
            ))
        };
        let mut parts = line.splitn(3, ' ');
        let (Some(h), Some(b), Some(p)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad("expected `<sha256> <bytes> <path>`"));
        };
        if h.len() != 64
            || !h
                .bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        {
            return Err(bad("not a lowercase sha256"));
        }
        let bytes: u64 = b.parse().map_err(|_| bad("size is not a number"))?;
        if p.is_empty() || p.starts_with('/') || p.split('/').any(|c| c == ".." || c.is_empty()) {
            return Err(bad("path must be relative and inside the directory"));
        }
        if let Some(prev) = out.last() {
            if prev.path.as_str() >= p {
                return Err(bad("paths must be sorted and unique"));
            }
        }
        out.push(Entry {
            sha256: h.to_string(),
            bytes,
            path: p.to_string(),
        });
    }
    Ok(out)
}

/// Checks every listed file's size and hash, and that no unlisted file is present. The first
/// problem found is the error, naming the file.
pub fn verify(dir: &Path, progress: &ProgressBar) -> Result<Verified> {
    let root = canonical_root(dir)?;
    let mpath: PathBuf = dir.join(MANIFEST);
    let text = crate::files::read_text(&mpath)?;
    let entries = parse(&text, &mpath)?;
    progress.set_length(entries.iter().map(|e| e.bytes).sum());
    for e in &entries {
        let p = dir.join(&e.path);
        if p.symlink_metadata().is_err() {
            return Err(Error::Manifest(format!(
                "{}: missing (listed in MANIFEST)",
                p.display()
            )));
        }
        regular_inside(&root, &p)?;
        let len = p.metadata().map_err(|e| Error::io(&p, e))?.len();
        if len != e.bytes {
            return Err(Error::Manifest(format!(
                "{}: size {len} bytes, MANIFEST says {}",
                p.display(),
                e.bytes
            )));
        }
        let (h, _) = hash_file(&p, progress)?;
        if h != e.sha256 {
            return Err(Error::Manifest(format!(
                "{}: sha256 {h} differs from MANIFEST's {}",
                p.display(),
                e.sha256
            )));
        }
    }
    let listed: std::collections::HashSet<&str> = entries.iter().map(|e| e.path.as_str()).collect();
    for rel in relative_files(dir)? {
        if !listed.contains(rel.as_str()) {
            return Err(Error::Manifest(format!(
                "{}: present but not listed in MANIFEST",
                dir.join(rel).display()
            )));
        }
    }
    Ok(Verified {
        files: entries.len(),
        bytes: entries.iter().map(|e| e.bytes).sum(),
        digest: digest_of(&text),
    })
}

/// Creates the new checkpoint directory `out` through a staging directory renamed into place
/// once `fill` has written its files and their MANIFEST pins them, so a failed or interrupted
/// run never leaves a half-written directory under the final name. Returns the MANIFEST's
/// digest.
pub fn write_pinned_dir(out: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<String> {
    let mut digest = String::new();
    crate::files::with_staging_dir(out, |dir| {
        fill(dir)?;
        digest = write(dir, &ProgressBar::hidden())?;
        Ok(())
    })?;
    Ok(digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a.txt"), b"hello").unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/b.bin"), vec![7u8; 3000]).unwrap();
        d
    }

    #[test]
    fn write_then_verify_and_digest_is_stable() {
        let d = setup();
        let hidden = ProgressBar::hidden();
        let dig = write(d.path(), &hidden).unwrap();
        let text = std::fs::read_to_string(d.path().join(MANIFEST)).unwrap();
        assert_eq!(
            text.lines().next().unwrap(),
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824 5 a.txt"
        );
        assert!(text.contains(" 3000 sub/b.bin\n"));
        let v = verify(d.path(), &hidden).unwrap();
        assert_eq!((v.files, v.bytes), (2, 3005));
        assert_eq!(v.digest, dig);
        assert_eq!(write(d.path(), &hidden).unwrap(), dig);
    }

    #[test]
    fn verify_names_the_first_bad_file() {
        let hidden = ProgressBar::hidden();
        let d = setup();
        write(d.path(), &hidden).unwrap();
        std::fs::write(d.path().join("sub/b.bin"), vec![8u8; 3000]).unwrap();
        let e = verify(d.path(), &hidden).unwrap_err().to_string();
        assert!(e.contains("sub/b.bin") && e.contains("sha256"), "{e}");

        std::fs::write(d.path().join("sub/b.bin"), vec![7u8; 2999]).unwrap();
        let e = verify(d.path(), &hidden).unwrap_err().to_string();
        assert!(e.contains("sub/b.bin") && e.contains("size 2999"), "{e}");

        std::fs::remove_file(d.path().join("sub/b.bin")).unwrap();
        let e = verify(d.path(), &hidden).unwrap_err().to_string();
        assert!(e.contains("sub/b.bin") && e.contains("missing"), "{e}");

        let d = setup();
        write(d.path(), &hidden).unwrap();
        std::fs::write(d.path().join("extra.safetensors"), b"x").unwrap();
        let e = verify(d.path(), &hidden).unwrap_err().to_string();
        assert!(
            e.contains("extra.safetensors") && e.contains("not listed"),
            "{e}"
        );
    }

    #[test]
    fn malformed_manifests_are_rejected_with_line_numbers() {
        let p = Path::new("MANIFEST");
        let good = format!("{} 5 a.txt\n", "a".repeat(64));
        assert_eq!(parse(&good, p).unwrap().len(), 1);
        for bad in [
            format!("{} 5\n", "a".repeat(64)),
            format!("{} five a.txt\n", "a".repeat(64)),
            format!("{} 5 a.txt\n", "A".repeat(64)),
            format!("{} 5 ../etc/passwd\n", "a".repeat(64)),
            format!("{} 5 /abs\n", "a".repeat(64)),
            format!("{0} 5 b\n{0} 5 a\n", "a".repeat(64)),
        ] {
            let e = parse(&bad, p).unwrap_err().to_string();
            assert!(e.contains("MANIFEST line"), "{e}");
        }
    }
}
