//! The build stage's work on a builder: the base tree with the bundle's files written over it,
//! built with the tree's own locked dependencies and no network (`cargo --locked --offline`).
//! Builds are cached by content: a build's key is the digest of the tree's commit, every file
//! of the bundle and the recipe, and the service keeps key → binary.
//!
//! Builds of different submissions share nothing writable. Each build has a directory of its
//! own (`BuildDir`: sources, target, cargo's home), removed when it is done. To rebuild only
//! what a change touches, a build starts from a copy of a *seed*: the sources and target of a
//! finished build of the track's pinned baseline (trusted code), kept read-only and only ever
//! copied from. Every build sees its directories at the same paths (`sandbox::build_paths`), so
//! the copied target's fingerprints hold and cargo recompiles only the crates whose files differ.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

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

/// One build's own directories, removed when dropped (unless kept as a seed).
pub struct BuildDir {
    pub root: PathBuf,
    pub src: PathBuf,
    pub target: PathBuf,
    pub cargo_home: PathBuf,
}

impl BuildDir {
    /// A new, empty build directory under `parent`.
    pub fn new(parent: &Path) -> Result<BuildDir> {
        std::fs::create_dir_all(parent).with_context(|| parent.display().to_string())?;
        let root = tempfile::Builder::new()
            .prefix("build-")
            .tempdir_in(parent)?
            .keep();
        let d = BuildDir {
            src: root.join("src"),
            target: root.join("target"),
            cargo_home: root.join("cargo-home"),
            root,
        };
        for p in [&d.src, &d.target, &d.cargo_home] {
            std::fs::create_dir_all(p)?;
        }
        Ok(d)
    }

    /// Starts from `seed`'s sources and target, their files' times kept (so that cargo sees
    /// only what the build then changes as changed).
    pub fn seed_from(&self, seed: &Path) -> Result<()> {
        for part in ["src", "target"] {
            let st = Command::new("cp")
                .arg("-a")
                .arg(format!("{}/.", seed.join(part).display()))
                .arg(self.root.join(part))
                .status()
                .context("running cp")?;
            if !st.success() {
                bail!("copying the seed {} ({part}): {st}", seed.display());
            }
        }
        Ok(())
    }

    /// Keeps the sources and target at `seed` (a finished trusted build), for later builds to
    /// copy; a seed already there stays.
    pub fn keep_as_seed(self, seed: &Path) -> Result<()> {
        if seed.exists() {
            return Ok(());
        }
        let parent = seed.parent().expect("a seed has a parent");
        std::fs::create_dir_all(parent)?;
        let tmp = tempfile::Builder::new()
            .prefix(".seed-")
            .tempdir_in(parent)?
            .keep();
        std::fs::rename(&self.src, tmp.join("src"))?;
        std::fs::rename(&self.target, tmp.join("target"))?;
        if std::fs::rename(&tmp, seed).is_err() {
            // Another runner of this cache kept one first.
            let _ = std::fs::remove_dir_all(&tmp);
        }
        Ok(())
    }
}

impl Drop for BuildDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The crates' sources every build reads, as a user other than the runner's can: the host's
/// cargo registry itself when candidates run as the runner's user, else a copy under `cache`
/// with every file readable by all (crates unpack with their own modes, some owner-only),
/// made again when the host's registry holds other crates.
pub fn registry(cache: &Path, shared: bool) -> Result<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .context("neither CARGO_HOME nor HOME is set: where is cargo's registry?")?;
    let host = home.join("registry");
    if !shared {
        return Ok(host);
    }
    let listing = |r: &Path| -> String {
        let mut names = vec![];
        for part in ["index", "src"] {
            let _ = walk_names(&r.join(part), 2, &mut names);
        }
        names.sort();
        names.join("\n")
    };
    let dst = cache.join("registry");
    let marker = cache.join("registry.listing");
    let want = listing(&host);
    let _lock = Lock::take(&cache.join("registry.lock"))?;
    if std::fs::read_to_string(&marker).is_ok_and(|m| m == want) && dst.is_dir() {
        return Ok(dst);
    }
    let tmp = tempfile::Builder::new()
        .prefix(".registry-")
        .tempdir_in(cache)?
        .keep();
    let copy = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", host.display()))
        .arg(&tmp)
        .status()
        .context("running cp")?;
    let open = Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(&tmp)
        .status()?;
    if !copy.success() || !open.success() {
        bail!(
            "copying cargo's registry {} to {}",
            host.display(),
            tmp.display()
        );
    }
    if dst.exists() {
        std::fs::remove_dir_all(&dst)?;
    }
    std::fs::rename(&tmp, &dst)?;
    write_atomic(&marker, want.as_bytes())?;
    Ok(dst)
}

/// The names of the entries `depth` levels under `dir`, as relative paths.
fn walk_names(dir: &Path, depth: usize, out: &mut Vec<String>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if depth > 1 && e.file_type()?.is_dir() {
            let mut inner = vec![];
            walk_names(&e.path(), depth - 1, &mut inner)?;
            out.extend(inner.into_iter().map(|n| format!("{name}/{n}")));
        } else {
            out.push(name);
        }
    }
    Ok(())
}

/// A failed build's public words: how many errors the compiler reported and their codes,
/// never its text (which quotes sources, and what a macro or an `include!` read).
pub fn failure_summary(log: &str) -> String {
    let mut codes = BTreeSet::new();
    let mut errors = 0;
    for l in log.lines() {
        let Some(rest) = l.strip_prefix("error") else {
            continue;
        };
        if rest.starts_with(": could not compile") || rest.starts_with(": aborting") {
            continue;
        }
        if let Some(code) = rest
            .strip_prefix('[')
            .and_then(|r| r.split(']').next())
            .filter(|c| {
                c.len() == 5 && c.starts_with('E') && c[1..].bytes().all(|b| b.is_ascii_digit())
            })
        {
            codes.insert(code.to_string());
        }
        if rest.starts_with('[') || rest.starts_with(':') {
            errors += 1;
        }
    }
    let codes: Vec<String> = codes.into_iter().collect();
    let mut s = format!("the build failed: {errors} compiler error(s)");
    if !codes.is_empty() {
        s += &format!(" ({})", codes.join(", "));
    }
    s + "; build the tree locally (cargo build --release --locked --offline) to see them"
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
    fn a_failed_build_is_told_by_its_error_codes_never_its_text() {
        let log = "   Compiling x v0.1.0\nerror[E0308]: mismatched types\n --> src/a.rs:3:5\n  |\n3 | root:x:0:0:root:/root:/bin/bash\nerror: expected item, found `root`\nerror[E0308]: again\nerror: aborting due to 3 previous errors\nerror: could not compile `x`\n";
        let s = failure_summary(log);
        assert!(
            s.starts_with("the build failed: 3 compiler error(s) (E0308)"),
            "{s}"
        );
        assert!(!s.contains("root") && !s.contains("src/a.rs"), "{s}");
    }

    /// Two builds run side by side: from inside one, the other's directories are nowhere (not
    /// at the shared paths, not at their own), and what it writes lands in its own only.
    #[test]
    fn two_builds_see_none_of_each_others_files() {
        use crate::runner::sandbox::{build_mounts, BuildMounts, Sandbox};
        let sandbox = Sandbox::find("cpu").expect("bubblewrap is installed (tools/test.sh)");
        // Not under /tmp: the sandbox's /tmp is its own, which would hide it anyway.
        let root = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let (a, b) = (
            BuildDir::new(&root.path().join("builds")).unwrap(),
            BuildDir::new(&root.path().join("builds")).unwrap(),
        );
        write_atomic(&a.target.join("release/secret"), b"a's binary").unwrap();
        let registry = root.path().join("registry");
        std::fs::create_dir(&registry).unwrap();
        sandbox.give(&a.root).unwrap();
        sandbox.give(&b.root).unwrap();
        let mounts = build_mounts(&BuildMounts {
            src: &b.src,
            target: &b.target,
            cargo_home: &b.cargo_home,
            registry: &registry,
        });
        let try_ = |script: &str| {
            sandbox
                .command(&mounts, &[], Path::new("/bin/sh"))
                .args(["-c", script])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .unwrap()
                .success()
        };
        let a_secret = a.target.join("release/secret");
        assert!(
            !try_("cat /build/target/release/secret"),
            "b sees a's target"
        );
        assert!(
            !try_(&format!("cat '{}'", a_secret.display())),
            "b sees a's directory"
        );
        assert!(!try_(&format!(
            "ls '{}'",
            root.path().join("builds").display()
        )));
        assert!(
            try_("echo b > /build/target/mine"),
            "b cannot write its own target"
        );
        assert!(
            !try_("echo b > /build/cargo-home/registry/x"),
            "the registry is writable"
        );
        assert!(b.target.join("mine").is_file() && !a.target.join("mine").exists());
    }

    #[test]
    fn a_build_starts_from_its_seed_with_the_seeds_file_times_and_is_removed_after() {
        let d = tempfile::tempdir().unwrap();
        let seed = d.path().join("seed");
        write_atomic(&seed.join("src/a.rs"), b"a").unwrap();
        write_atomic(&seed.join("target/release/x"), b"bin").unwrap();
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        std::fs::File::options()
            .write(true)
            .open(seed.join("src/a.rs"))
            .unwrap()
            .set_modified(old)
            .unwrap();
        let b = BuildDir::new(&d.path().join("builds")).unwrap();
        b.seed_from(&seed).unwrap();
        let root = b.root.clone();
        assert_eq!(std::fs::read(b.target.join("release/x")).unwrap(), b"bin");
        let m = std::fs::metadata(b.src.join("a.rs"))
            .unwrap()
            .modified()
            .unwrap();
        assert_eq!(m, old, "the seed's file times are kept");
        std::fs::write(b.target.join("release/x"), b"changed").unwrap();
        assert_eq!(
            std::fs::read(seed.join("target/release/x")).unwrap(),
            b"bin"
        );
        drop(b);
        assert!(!root.exists(), "a build's directory goes with it");
        // A trusted build kept as a seed moves its sources and target there.
        let t = BuildDir::new(&d.path().join("builds")).unwrap();
        write_atomic(&t.src.join("b.rs"), b"b").unwrap();
        let seed2 = d.path().join("seeds/k");
        t.keep_as_seed(&seed2).unwrap();
        assert_eq!(std::fs::read(seed2.join("src/b.rs")).unwrap(), b"b");
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
