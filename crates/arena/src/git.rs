//! The arena's repository, through the `git` command: trees of bases served to builders, blobs
//! compared for reverts, and promotion commits made with plumbing on a private index (the
//! repository's work tree and branches checked out by people are never touched).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

fn git(repo: &Path) -> Command {
    let mut c = Command::new("git");
    c.arg("-C").arg(repo);
    c
}

/// `git -C repo ARGS`'s standard output; a failure says `git ARGS: <what git said>`.
pub fn output(repo: &Path, args: &[&str]) -> Result<Vec<u8>> {
    let mut c = git(repo);
    c.args(args);
    run(c, &args.join(" "))
}

fn run(mut c: Command, what: &str) -> Result<Vec<u8>> {
    let o = c.output().with_context(|| format!("running git {what}"))?;
    if !o.status.success() {
        bail!("git {what}: {}", String::from_utf8_lossy(&o.stderr).trim());
    }
    Ok(o.stdout)
}

fn text(c: Command, what: &str) -> Result<String> {
    Ok(String::from_utf8_lossy(&run(c, what)?).trim().to_string())
}

/// The full hash of the commit `rev` names.
pub fn resolve(repo: &Path, rev: &str) -> Result<String> {
    let mut c = git(repo);
    c.args([
        "rev-parse",
        "--verify",
        "--quiet",
        &format!("{rev}^{{commit}}"),
    ]);
    text(c, "rev-parse").with_context(|| format!("{rev} is not a commit in {}", repo.display()))
}

/// The tree of `commit` as a tar.
pub fn archive(repo: &Path, commit: &str) -> Result<Vec<u8>> {
    let mut c = git(repo);
    c.args(["archive", "--format=tar", commit]);
    run(c, "archive")
}

/// The blob id of `path` at `commit`, `None` when the commit has no such file.
pub fn blob(repo: &Path, commit: &str, path: &str) -> Result<Option<String>> {
    let mut c = git(repo);
    c.args(["ls-tree", "-z", commit, "--", path]);
    let out = run(c, "ls-tree")?;
    let line = String::from_utf8_lossy(&out);
    // `<mode> blob <id>\t<path>\0`
    Ok(line
        .split('\0')
        .find(|l| l.ends_with(&format!("\t{path}")))
        .and_then(|l| l.split_whitespace().nth(2))
        .map(str::to_string))
}

/// The contents of `path` at `commit`, `None` when the commit has no such file.
pub fn contents(repo: &Path, commit: &str, path: &str) -> Result<Option<Vec<u8>>> {
    let Some(id) = blob(repo, commit, path)? else {
        return Ok(None);
    };
    let mut c = git(repo);
    c.args(["cat-file", "blob", &id]);
    run(c, "cat-file").map(Some)
}

/// A new commit: `parent`'s tree with `files` (path, contents, mode) written over it.
pub fn commit_files(
    repo: &Path,
    parent: &str,
    files: &[(String, Vec<u8>, u32)],
    message: &str,
) -> Result<String> {
    let index = tempfile::NamedTempFile::new().context("a private git index")?;
    let with_index = |args: &[&str]| {
        let mut c = git(repo);
        c.env("GIT_INDEX_FILE", index.path()).args(args);
        c
    };
    run(with_index(&["read-tree", parent]), "read-tree")?;
    for (path, data, mode) in files {
        let mut c = git(repo);
        c.args(["hash-object", "-w", "--stdin"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().context("running git hash-object")?;
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(data)
            .context("writing to git hash-object")?;
        let o = child.wait_with_output()?;
        if !o.status.success() {
            bail!(
                "git hash-object: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
        let id = String::from_utf8_lossy(&o.stdout).trim().to_string();
        let mode = if mode & 0o111 != 0 {
            "100755"
        } else {
            "100644"
        };
        run(
            with_index(&[
                "update-index",
                "--add",
                "--cacheinfo",
                &format!("{mode},{id},{path}"),
            ]),
            "update-index",
        )?;
    }
    // The entries read from `parent` are not re-checked: a partial clone (what a GPU runner's
    // service is staged with) has its trees but not every blob.
    let tree = text(with_index(&["write-tree", "--missing-ok"]), "write-tree")?;
    let mut c = git(repo);
    c.args(["commit-tree", &tree, "-p", parent, "-m", message])
        .env("GIT_AUTHOR_NAME", "fastdecode arena")
        .env("GIT_AUTHOR_EMAIL", "arena@fastdecode.invalid")
        .env("GIT_COMMITTER_NAME", "fastdecode arena")
        .env("GIT_COMMITTER_EMAIL", "arena@fastdecode.invalid");
    text(c, "commit-tree")
}

/// Points `refs/heads/<branch>` at `commit`.
pub fn set_branch(repo: &Path, branch: &str, commit: &str) -> Result<()> {
    let mut c = git(repo);
    c.args(["update-ref", &format!("refs/heads/{branch}"), commit]);
    run(c, "update-ref").map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refs_resolve_to_commits_and_failures_name_what_git_was_asked() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path();
        output(repo, &["init", "--quiet"]).unwrap();
        output(
            repo,
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t.invalid",
                "commit",
                "--quiet",
                "--allow-empty",
                "-m",
                "first",
            ],
        )
        .unwrap();
        let head = resolve(repo, "HEAD").unwrap();
        assert!(head.len() == 40 && head.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(resolve(repo, &head[..12]).unwrap(), head);

        let e = format!("{:#}", resolve(repo, "no-such-ref").unwrap_err());
        assert!(
            e.starts_with(&format!(
                "no-such-ref is not a commit in {}",
                repo.display()
            )),
            "{e}"
        );
        let e = format!(
            "{:#}",
            output(repo, &["cat-file", "-e", "no-such-ref"]).unwrap_err()
        );
        assert!(e.starts_with("git cat-file -e no-such-ref: "), "{e}");
    }
}
