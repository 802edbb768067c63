//! The build stage's work on a builder: the base tree with the bundle's files written over it,
//! built with the tree's own locked dependencies and no network (`cargo --locked --offline`).
//! Builds are cached by content: a build's key is the digest of the tree's commit, every file
//! of the bundle and the recipe, and the service keeps key → binary. A builder builds in one
//! directory, rewriting only the files that differ from the last build there, so cargo rebuilds
//! only the crates a change touches (a lock keeps two runners of one machine apart).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::store::write_atomic;
use crate::track::Build;

/// The build key of `commit` with `files` (path, contents, mode) under `recipe`.
pub fn key(commit: &str, files: &[(String, Vec<u8>, u32)], recipe: &Build) -> String {
    let mut h = Sha256::new();
    h.update(b"fastdecode-arena build v1\0");
    h.update(commit.as_bytes());
    let mut sorted: Vec<_> = files.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    for (p, data, mode) in sorted {
        h.update(b"\0file\0");
        h.update(p.as_bytes());
        h.update(format!("\0{}\0", mode & 0o111 != 0).as_bytes());
        h.update(Sha256::digest(data));
    }
    for a in &recipe.cargo_args {
        h.update(b"\0arg\0");
        h.update(a.as_bytes());
    }
    h.update(b"\0bin\0");
    h.update(recipe.binary.as_bytes());
    format!("sha256:{}", hex::encode(h.finalize()))
}

/// An exclusive `flock` on a file, released when dropped.
pub struct Lock {
    // Held open: the lock lasts as long as the descriptor.
    _file: std::fs::File,
}

impl Lock {
    pub fn take(path: &Path) -> Result<Lock> {
        use std::os::fd::AsRawFd;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .with_context(|| path.display().to_string())?;
        // SAFETY: flock on a descriptor this value owns.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            bail!(
                "{}: cannot lock: {}",
                path.display(),
                std::io::Error::last_os_error()
            );
        }
        Ok(Lock { _file: f })
    }
}

fn walk(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let dir = root.join(rel);
    for e in std::fs::read_dir(&dir).with_context(|| dir.display().to_string())? {
        let e = e?;
        let r = rel.join(e.file_name());
        let t = e.file_type()?;
        if t.is_dir() {
            walk(root, &r, out)?;
        } else {
            out.push(r);
        }
    }
    Ok(())
}

/// Makes `dst` hold exactly `tree` with `files` written over it, touching only what differs.
pub fn sync(tree: &Path, files: &[(String, Vec<u8>, u32)], dst: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut want: BTreeSet<PathBuf> = BTreeSet::new();
    let mut list = vec![];
    walk(tree, Path::new(""), &mut list)?;
    let put = |rel: &Path, data: &[u8], mode: u32| -> Result<()> {
        let p = dst.join(rel);
        let same = std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_file())
            && std::fs::read(&p).is_ok_and(|old| old == data);
        if !same {
            write_atomic(&p, data)?;
        }
        let exec = if mode & 0o111 != 0 { 0o755 } else { 0o644 };
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(exec))?;
        Ok(())
    };
    let overlay: std::collections::BTreeMap<&str, (&[u8], u32)> = files
        .iter()
        .map(|(p, d, m)| (p.as_str(), (d.as_slice(), *m)))
        .collect();
    for rel in list {
        let key = rel.to_string_lossy().to_string();
        want.insert(rel.clone());
        if overlay.contains_key(key.as_str()) {
            continue;
        }
        let src = tree.join(&rel);
        let m = std::fs::symlink_metadata(&src)?;
        if m.file_type().is_symlink() {
            // Trees hold only files here (a link in a base tree is kept out of the build).
            continue;
        }
        put(&rel, &std::fs::read(&src)?, m.permissions().mode())?;
    }
    for (p, (data, mode)) in &overlay {
        want.insert(PathBuf::from(p));
        put(Path::new(p), data, *mode)?;
    }
    if dst.is_dir() {
        let mut have = vec![];
        walk(dst, Path::new(""), &mut have)?;
        for rel in have {
            if !want.contains(&rel) {
                std::fs::remove_file(dst.join(&rel))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recipe() -> Build {
        Build {
            cargo_args: vec!["build".into()],
            binary: "release/x".into(),
        }
    }

    #[test]
    fn the_key_is_the_content() {
        let a = vec![
            ("a.rs".to_string(), b"1".to_vec(), 0o644),
            ("b.rs".to_string(), b"2".to_vec(), 0o644),
        ];
        let mut b = a.clone();
        b.reverse();
        assert_eq!(key("c", &a, &recipe()), key("c", &b, &recipe()));
        assert_ne!(key("c", &a, &recipe()), key("d", &a, &recipe()));
        b[0].1 = b"3".to_vec();
        assert_ne!(key("c", &a, &recipe()), key("c", &b, &recipe()));
        assert_ne!(key("c", &[], &recipe()), key("c", &a, &recipe()));
    }

    #[test]
    fn sync_rewrites_only_what_differs_and_drops_what_went() {
        let d = tempfile::tempdir().unwrap();
        let (tree, dst) = (d.path().join("tree"), d.path().join("dst"));
        write_atomic(&tree.join("src/a.rs"), b"a").unwrap();
        write_atomic(&tree.join("src/b.rs"), b"b").unwrap();
        sync(&tree, &[("src/c.rs".into(), b"c".to_vec(), 0o644)], &dst).unwrap();
        assert_eq!(std::fs::read(dst.join("src/c.rs")).unwrap(), b"c");
        let before = std::fs::metadata(dst.join("src/a.rs"))
            .unwrap()
            .modified()
            .unwrap();
        sync(&tree, &[("src/b.rs".into(), b"B".to_vec(), 0o644)], &dst).unwrap();
        assert_eq!(
            std::fs::metadata(dst.join("src/a.rs"))
                .unwrap()
                .modified()
                .unwrap(),
            before
        );
        assert_eq!(std::fs::read(dst.join("src/b.rs")).unwrap(), b"B");
        assert!(!dst.join("src/c.rs").exists());
    }
}
