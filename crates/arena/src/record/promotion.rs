//! Promotion: a confirmed winner becomes its track's new base, a commit in the arena's
//! repository (branch `arena-base/<track>`, the solver as co-author). A change is applied as its
//! files written over the current base, so it is promoted only when none of those files has
//! changed since the base it was made and priced on: otherwise it would silently revert an
//! earlier promoted change, and it is held with the reason. After a promotion every held
//! submission of the track is re-priced on the new base, as a new submission that names it
//! (`reprice_of`), unless its files overlap the promoted change (then it says so and stays
//! held: its solver must rebase it).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;
use sqlx::Row;

use crate::bundle::{self, Kind};
use crate::git;
use crate::service::db::new_id;
use crate::service::{stages, Service};
use crate::store::Store;
use crate::track::Track;

/// The branch of a track's bases in the arena's repository (`arena-base/<track>`: its own
/// namespace, so a branch named `arena` cannot block it).
pub fn branch(track: &str) -> String {
    format!("arena-base/{track}")
}

/// The regular files of a stored bundle.
pub fn bundle_files(store: &Store, digest: &str) -> Result<Vec<(String, Vec<u8>, u32)>> {
    let bytes = store
        .artifact(digest)?
        .with_context(|| format!("bundle {digest}: not in the artifact store"))?;
    Ok(bundle::read(&bytes, u64::MAX)?
        .into_iter()
        .filter(|e| e.kind == Kind::File)
        .map(|e| (e.path, e.data, e.mode))
        .collect())
}

/// The first of `paths` whose file differs between commits `a` and `b`.
fn changed_between(repo: &Path, a: &str, b: &str, paths: &[String]) -> Result<Option<String>> {
    for p in paths {
        if git::blob(repo, a, p)? != git::blob(repo, b, p)? {
            return Ok(Some(p.clone()));
        }
    }
    Ok(None)
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .context("a blocking task")?
}

/// Promotes `submission`: `Ok(Ok(new base))`, or `Ok(Err(why not))`.
pub async fn promote(
    s: &Service,
    tx: &mut sqlx::AnyConnection,
    track: &Track,
    submission: &str,
    verdict: &Value,
    now: i64,
) -> Result<std::result::Result<String, String>> {
    let r = sqlx::query("SELECT solver, base_commit, bundle_digest FROM submissions WHERE id = $1")
        .bind(submission)
        .fetch_one(&mut *tx)
        .await?;
    let solver: String = r.try_get("solver")?;
    let its_base: String = r.try_get("base_commit")?;
    let digest: String = r.try_get("bundle_digest")?;
    let cur = sqlx::query(
        "SELECT seq, base_commit, submission FROM promotions WHERE track = $1 \
         ORDER BY seq DESC LIMIT 1",
    )
    .bind(&track.name)
    .fetch_one(&mut *tx)
    .await?;
    let seq: i64 = cur.try_get("seq")?;
    let base: String = cur.try_get("base_commit")?;
    let files = bundle_files(&s.store, &digest)?;
    if files.is_empty() {
        // A no-op (or a re-pricing of the base itself) can out-measure the best by chance;
        // it has nothing to promote.
        return Ok(Err("it changes no file: there is nothing to promote".into()));
    }
    let paths: Vec<String> = files.iter().map(|f| f.0.clone()).collect();
    let repo: PathBuf = s.repo.clone();
    let score = verdict["score"].as_f64().unwrap_or(1.0);
    let message = format!(
        "arena: promote {submission} on track {} (score {score:.4})\n\n\
         Priced against the pinned baseline {}.\n\nCo-authored-by: {solver} <{solver}@arena.invalid>\n",
        track.name, track.baseline
    );
    let (b, ib) = (base.clone(), its_base.clone());
    let reverted = {
        let repo = repo.clone();
        let paths = paths.clone();
        blocking(move || changed_between(&repo, &ib, &b, &paths)).await?
    };
    if let Some(p) = reverted {
        return Ok(Err(format!(
            "{p} changed on the track's base since this submission's base (an earlier \
             promotion); promoting it would revert that change"
        )));
    }
    let branch = branch(&track.name);
    let made = {
        let (repo, base) = (repo.clone(), base.clone());
        blocking(move || {
            let c = git::commit_files(&repo, &base, &files, &message)?;
            git::set_branch(&repo, &branch, &c)?;
            Ok(c)
        })
        .await
    };
    // The repository refusing a commit is the service's trouble: the submission stays held
    // with the reason instead of its report failing (and its pricing running again).
    let commit = match made {
        Ok(c) => c,
        Err(e) => return Ok(Err(format!("the promotion commit failed: {e:#}"))),
    };
    sqlx::query(
        "INSERT INTO promotions (track, seq, submission, base_commit, score, created_ms) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(&track.name)
    .bind(seq + 1)
    .bind(submission)
    .bind(&commit)
    .bind(score)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    reprice_held(s, tx, track, submission, &commit, now).await?;
    Ok(Ok(commit))
}

/// Queues every held submission of `track` again on `new_base`.
async fn reprice_held(
    s: &Service,
    tx: &mut sqlx::AnyConnection,
    track: &Track,
    promoted: &str,
    new_base: &str,
    now: i64,
) -> Result<()> {
    let held = sqlx::query(
        "SELECT id, solver, model, claimed_score, note, note_html, bundle_digest, base_commit \
         FROM submissions WHERE track = $1 AND status = 'held' AND id <> $2 ORDER BY created_ms, id",
    )
    .bind(&track.name)
    .bind(promoted)
    .fetch_all(&mut *tx)
    .await?;
    for h in held {
        let id: String = h.try_get("id")?;
        let digest: String = h.try_get("bundle_digest")?;
        let its_base: String = h.try_get("base_commit")?;
        let paths: Vec<String> = bundle_files(&s.store, &digest)?
            .into_iter()
            .map(|f| f.0)
            .collect();
        let (repo, nb) = (s.repo.clone(), new_base.to_string());
        let overlap = blocking(move || changed_between(&repo, &its_base, &nb, &paths)).await?;
        if let Some(p) = overlap {
            stages::record(
                tx,
                &id,
                "reprice",
                "skipped",
                &format!("{p} changed in the promotion of {promoted}: rebase and submit again"),
                now,
            )
            .await?;
            continue;
        }
        let new = new_id("s");
        sqlx::query(
            "INSERT INTO submissions (id, solver, track, idempotency_key, model, claimed_score, \
             note, note_html, bundle_digest, base_commit, reprice_of, created_ms, status, \
             next_stage, next_kind) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 'queued', $13, $14)",
        )
        .bind(&new)
        .bind(h.try_get::<String, _>("solver")?)
        .bind(&track.name)
        .bind(format!("reprice:{id}:{new_base}"))
        .bind(h.try_get::<Option<String>, _>("model")?)
        .bind(h.try_get::<Option<f64>, _>("claimed_score")?)
        .bind(h.try_get::<String, _>("note")?)
        .bind(h.try_get::<Option<String>, _>("note_html")?)
        .bind(&digest)
        .bind(new_base)
        .bind(&id)
        .bind(now)
        .bind(stages::POLICY)
        .bind(stages::kind(stages::POLICY, track))
        .execute(&mut *tx)
        .await?;
        sqlx::query("UPDATE submissions SET status = 'repriced' WHERE id = $1")
            .bind(&id)
            .execute(&mut *tx)
            .await?;
        stages::record(
            tx,
            &id,
            "reprice",
            "queued",
            &format!("re-priced on the new base {new_base} as {new}"),
            now,
        )
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn git_in(dir: &Path, args: &[&str]) -> String {
        let o = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@t.invalid")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@t.invalid")
            .output()
            .expect("git runs");
        assert!(
            o.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    fn file(path: &str, text: &str) -> (String, Vec<u8>, u32) {
        (path.to_string(), text.as_bytes().to_vec(), 0o644)
    }

    /// The revert guard: a submission made on an older base is held when a file it writes was
    /// changed (or added) by a promotion since, and goes ahead when the promotions touched only
    /// other files, so two solvers' changes to different files can both land.
    #[test]
    fn a_change_to_a_file_promoted_since_its_base_is_a_revert() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path();
        git_in(repo, &["init", "-q"]);
        std::fs::write(repo.join("a.rs"), "fn a() {}\n").unwrap();
        std::fs::write(repo.join("b.rs"), "fn b() {}\n").unwrap();
        git_in(repo, &["add", "a.rs", "b.rs"]);
        git_in(repo, &["commit", "-q", "-m", "base"]);
        let base0 = git_in(repo, &["rev-parse", "HEAD"]);
        // An earlier promotion rewrote a.rs and added c.rs.
        let promoted = [
            file("a.rs", "fn a() { /* faster */ }\n"),
            file("c.rs", "fn c() {}\n"),
        ];
        let base1 = git::commit_files(repo, &base0, &promoted, "promote").unwrap();
        let paths = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();

        // Made on base0, it writes a.rs over base1: that would undo the promotion.
        assert_eq!(
            changed_between(repo, &base0, &base1, &paths(&["b.rs", "a.rs"])).unwrap(),
            Some("a.rs".to_string())
        );
        // A file the promotion added counts as changed (absent then, present now).
        assert_eq!(
            changed_between(repo, &base0, &base1, &paths(&["c.rs"])).unwrap(),
            Some("c.rs".to_string())
        );
        // Only files the promotion left alone: no revert.
        assert_eq!(
            changed_between(repo, &base0, &base1, &paths(&["b.rs", "d.rs"])).unwrap(),
            None
        );
        // Made on the current base itself: nothing changed since.
        assert_eq!(
            changed_between(repo, &base1, &base1, &paths(&["a.rs", "c.rs"])).unwrap(),
            None
        );
    }
}
