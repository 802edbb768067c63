//! The lease of a job. A runner leases one submission at the stage it may run (its kind, or a
//! build when it is a builder), and keeps it by heartbeating. A lease that expires returns the
//! job to the queue: the next runner to lease it closes the stale stage row as
//! `infra:lease_expired` and runs that stage again; every stage finished before it stays done.
//! Two runners never hold one job: on SQLite the lease is taken in an immediate (write-locked)
//! transaction, on PostgreSQL the candidate row is selected `FOR UPDATE SKIP LOCKED`.

use anyhow::Result;
use sqlx::Row;

use crate::service::db::{new_id, now_ms, Backend, Db};
use crate::service::stages;

/// The order of the queue's first key: every leaderboard job (0) before any private run (1,
/// `test` or `benchmark`), oldest first within each.
const PRIORITY: &str = "(CASE WHEN mode = 'leaderboard' THEN 0 ELSE 1 END)";

/// A job just leased.
pub struct Leased {
    pub submission: String,
    pub lease_id: String,
    pub stage: String,
}

/// Leases the first job a runner of `kind` (and a builder, when `builder`) may run, if any:
/// the oldest leaderboard job, else the oldest private run (`PRIORITY`).
pub async fn take(
    db: &Db,
    runner: &str,
    kind: &str,
    builder: bool,
    lease_ms: i64,
) -> Result<Option<Leased>> {
    let now = now_ms();
    let mut tx = db.write().await?;
    let lock = match db.backend {
        Backend::Postgres => " FOR UPDATE SKIP LOCKED",
        Backend::Sqlite => "",
    };
    let sql = format!(
        "SELECT id, next_stage, lease_id FROM submissions \
         WHERE next_stage IS NOT NULL AND (next_kind = $1 OR next_kind = $2) \
         AND (lease_id IS NULL OR lease_expires_ms < $3) \
         ORDER BY {PRIORITY}, created_ms, id LIMIT 1{lock}"
    );
    let row = sqlx::query(&sql)
        .bind(kind)
        .bind(if builder { stages::BUILDER } else { "" })
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
    let Some(row) = row else {
        tx.rollback().await?;
        return Ok(None);
    };
    let submission: String = row.try_get("id")?;
    let stage: String = row.try_get("next_stage")?;
    let stale: Option<String> = row.try_get("lease_id")?;
    if stale.is_some() {
        stages::abandon(&mut tx, &submission, now).await?;
    }
    let lease_id = new_id("lease");
    sqlx::query(
        "UPDATE submissions SET lease_runner = $1, lease_id = $2, lease_expires_ms = $3, \
         status = 'running' WHERE id = $4",
    )
    .bind(runner)
    .bind(&lease_id)
    .bind(now + lease_ms)
    .bind(&submission)
    .execute(&mut *tx)
    .await?;
    stages::start(&mut tx, &submission, &stage, Some(runner), now).await?;
    tx.commit().await?;
    Ok(Some(Leased {
        submission,
        lease_id,
        stage,
    }))
}

/// The most of a runner's progress line the record keeps.
pub const PROGRESS_CHARS: usize = 240;

/// Extends a lease and, given `progress`, shows it as the running stage's detail (control
/// characters dropped, at most `PROGRESS_CHARS`); false when the lease is no longer this
/// runner's (expired and taken, or finished), and then nothing is written.
pub async fn heartbeat(
    db: &Db,
    submission: &str,
    lease_id: &str,
    lease_ms: i64,
    progress: Option<&str>,
) -> Result<bool> {
    let mut tx = db.write().await?;
    let r =
        sqlx::query("UPDATE submissions SET lease_expires_ms = $1 WHERE id = $2 AND lease_id = $3")
            .bind(now_ms() + lease_ms)
            .bind(submission)
            .bind(lease_id)
            .execute(&mut *tx)
            .await?;
    if r.rows_affected() != 1 {
        tx.rollback().await?;
        return Ok(false);
    }
    if let Some(p) = progress {
        let line: String = p
            .chars()
            .filter(|c| !c.is_control())
            .take(PROGRESS_CHARS)
            .collect();
        sqlx::query("UPDATE stages SET detail = $1 WHERE submission = $2 AND ended_ms IS NULL")
            .bind(line)
            .bind(submission)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(true)
}

/// Whether `lease_id` still holds `submission` at `stage` (inside a report's transaction). On
/// PostgreSQL the row stays locked until the transaction ends, so an operator's cancel or an
/// expired lease's new holder cannot change it between this check and the report's writes (on
/// SQLite the write transaction holds the whole database).
pub async fn holds(
    tx: &mut sqlx::AnyConnection,
    backend: Backend,
    submission: &str,
    lease_id: &str,
    stage: &str,
) -> Result<bool> {
    let lock = match backend {
        Backend::Postgres => " FOR UPDATE",
        Backend::Sqlite => "",
    };
    let row = sqlx::query(&format!(
        "SELECT lease_id, next_stage FROM submissions WHERE id = $1{lock}"
    ))
    .bind(submission)
    .fetch_optional(&mut *tx)
    .await?;
    Ok(match row {
        Some(r) => {
            let l: Option<String> = r.try_get("lease_id")?;
            let s: Option<String> = r.try_get("next_stage")?;
            l.as_deref() == Some(lease_id) && s.as_deref() == Some(stage)
        }
        None => false,
    })
}

/// Moves the job on to `stage` for a runner of `kind`: kept by the same lease when `keep`
/// (the runner can run it), else back in the queue.
pub async fn advance(
    tx: &mut sqlx::AnyConnection,
    submission: &str,
    stage: &str,
    kind: &str,
    keep: Option<(&str, i64)>,
    now: i64,
) -> Result<()> {
    match keep {
        Some((runner, lease_ms)) => {
            sqlx::query(
                "UPDATE submissions SET next_stage = $1, next_kind = $2, lease_expires_ms = $3 \
                 WHERE id = $4",
            )
            .bind(stage)
            .bind(kind)
            .bind(now + lease_ms)
            .bind(submission)
            .execute(&mut *tx)
            .await?;
            stages::start(tx, submission, stage, Some(runner), now).await?;
        }
        None => {
            sqlx::query(
                "UPDATE submissions SET next_stage = $1, next_kind = $2, lease_runner = NULL, \
                 lease_id = NULL, lease_expires_ms = NULL, status = 'queued' WHERE id = $3",
            )
            .bind(stage)
            .bind(kind)
            .bind(submission)
            .execute(&mut *tx)
            .await?;
        }
    }
    Ok(())
}

/// Ends the job: no next stage, no lease.
pub async fn end(tx: &mut sqlx::AnyConnection, submission: &str) -> Result<()> {
    sqlx::query(
        "UPDATE submissions SET next_stage = NULL, next_kind = NULL, lease_runner = NULL, \
         lease_id = NULL, lease_expires_ms = NULL WHERE id = $1",
    )
    .bind(submission)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Submissions ahead of `submission` in the queue of its kind (while it waits), in the order
/// `take` leases them: every waiting leaderboard job is ahead of a private run.
pub async fn queue_position(db: &Db, submission: &str) -> Result<Option<i64>> {
    let row =
        sqlx::query("SELECT next_kind, created_ms, lease_id, mode FROM submissions WHERE id = $1")
            .bind(submission)
            .fetch_optional(&db.pool)
            .await?;
    let Some(r) = row else { return Ok(None) };
    let kind: Option<String> = r.try_get("next_kind")?;
    let lease: Option<String> = r.try_get("lease_id")?;
    let (Some(kind), None) = (kind, lease) else {
        return Ok(None);
    };
    let created: i64 = r.try_get("created_ms")?;
    let mode: String = r.try_get("mode")?;
    let older = "(created_ms < $2 OR (created_ms = $3 AND id < $4))";
    let ahead = if mode == "leaderboard" {
        format!("mode = 'leaderboard' AND {older}")
    } else {
        format!("(mode = 'leaderboard' OR {older})")
    };
    let n: i64 = sqlx::query(&format!(
        "SELECT COUNT(*) AS n FROM submissions WHERE next_kind = $1 AND lease_id IS NULL \
         AND {ahead}"
    ))
    .bind(&kind)
    .bind(created)
    .bind(created)
    .bind(submission)
    .fetch_one(&db.pool)
    .await?
    .try_get("n")?;
    Ok(Some(n))
}
