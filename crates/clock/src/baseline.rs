//! The pinned baseline built from git: `--baseline-ref GITREF` resolves the ref to a commit, checks
//! it out in a temporary git worktree, builds it in release mode and keeps the binary in a cache
//! keyed by the commit, so a solver prices against exactly the build the ranked runner uses.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

fn git(repo: &Path, args: &[&str]) -> Result<String> {
    let o = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .output()
        .context("running git")?;
    if !o.status.success() {
        bail!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// The full commit hash `gitref` names in `repo`.
pub fn resolve(repo: &Path, gitref: &str) -> Result<String> {
    git(
        repo,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{gitref}^{{commit}}"),
        ],
    )
    .with_context(|| format!("{gitref:?} is not a commit in {}", repo.display()))
}

/// Where the binary of `commit` lives in `cache`.
pub fn cached_binary(cache: &Path, commit: &str) -> PathBuf {
    cache.join(commit).join("fastdecode")
}

/// The baseline binary of `gitref`: from the cache, or built now (minutes; `log` gets cargo's
/// progress lines).
pub fn build(repo: &Path, gitref: &str, cache: &Path, log: &dyn Fn(&str)) -> Result<PathBuf> {
    let commit = resolve(repo, gitref)?;
    let bin = cached_binary(cache, &commit);
    if bin.is_file() {
        log(&format!(
            "baseline {gitref} = {commit}: cached at {}",
            bin.display()
        ));
        return Ok(bin);
    }
    std::fs::create_dir_all(cache)
        .with_context(|| format!("{}: cannot create the cache", cache.display()))?;
    let tree = cache.join(format!("{commit}.src"));
    if tree.exists() {
        // A worktree left by an interrupted build.
        let _ = git(
            repo,
            &["worktree", "remove", "--force", &tree.to_string_lossy()],
        );
        let _ = std::fs::remove_dir_all(&tree);
    }
    log(&format!(
        "baseline {gitref} = {commit}: building in {}",
        tree.display()
    ));
    git(
        repo,
        &[
            "worktree",
            "add",
            "--detach",
            &tree.to_string_lossy(),
            &commit,
        ],
    )?;
    let built = (|| -> Result<PathBuf> {
        // One target directory for every cached baseline: later refs rebuild only what changed.
        let target = cache.join("target");
        let st = Command::new("cargo")
            .args(["build", "--release", "--locked", "-p", "fastdecode-cli"])
            .current_dir(&tree)
            .env("CARGO_TARGET_DIR", &target)
            .status()
            .context("running cargo")?;
        if !st.success() {
            bail!("building {gitref} ({commit}) failed ({st})");
        }
        Ok(target.join("release").join("fastdecode"))
    })();
    let _ = git(
        repo,
        &["worktree", "remove", "--force", &tree.to_string_lossy()],
    );
    let out = built?;
    let dir = bin.parent().expect("cache/commit/fastdecode");
    std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    let tmp = dir.join("fastdecode.partial");
    std::fs::copy(&out, &tmp).with_context(|| format!("copying {}", out.display()))?;
    std::fs::rename(&tmp, &bin).with_context(|| bin.display().to_string())?;
    Ok(bin)
}
