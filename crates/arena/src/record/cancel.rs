//! An operator's cancel of a job (`fastdecode arena admin cancel ID`). The submission ends
//! `failed` with category `cancelled` (not the solver's fault: it never counts against the
//! daily cap), its open stage row is closed with that outcome, and its lease is removed: the
//! runner holding it is answered 409 at its next heartbeat and kills the stage's processes, and
//! its report, if it gets that far, is refused the same way.

use anyhow::{bail, Result};
use sqlx::Row;

use crate::record::verdict;
use crate::service::caps::{Blame, CANCELLED};
use crate::service::db::{now_ms, Backend, Db};

/// What the record says of a cancelled job.
pub const DETAIL: &str = "cancelled by an operator";

/// Cancels submission `id`; the stage it was at. A finished or unknown submission is an error
/// naming it.
pub async fn cancel(db: &Db, id: &str) -> Result<String> {
    let now = now_ms();
    let mut tx = db.write().await?;
    let lock = match db.backend {
        Backend::Postgres => " FOR UPDATE",
        Backend::Sqlite => "",
    };
    let row = sqlx::query(&format!(
        "SELECT status, next_stage FROM submissions WHERE id = $1{lock}"
    ))
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        bail!("submission {id}: no such submission");
    };
    let status: String = row.try_get("status")?;
    let Some(stage) = row.try_get::<Option<String>, _>("next_stage")? else {
        bail!(
            "submission {id}: already finished ({status}); only a queued or running submission \
             can be cancelled"
        );
    };
    sqlx::query(
        "UPDATE stages SET ended_ms = $1, outcome = $2, detail = $3 \
         WHERE submission = $4 AND ended_ms IS NULL",
    )
    .bind(now)
    .bind(CANCELLED)
    .bind(DETAIL)
    .bind(id)
    .execute(&mut *tx)
    .await?;
    let failure = (stage.as_str(), CANCELLED, DETAIL);
    verdict::fail(&mut tx, id, failure, Blame::Free, now).await?;
    tx.commit().await?;
    Ok(stage)
}
