//! A submission's stages: their order, which kind of runner runs each, and their rows (one per
//! attempt: start, end, runner, outcome, public detail, private result).
//!
//! policy → review → build run on a builder (a CPU runner with the toolchain); on a track whose
//! model runs on CUDA, kernels (each build's kernel modules, compiled once); gate → price (and
//! the confirmation pricing of a promotion candidate, or a profile run's profile) on the track's
//! runner kind. The verdict is the service's, written when the last stage reports (`verdict`).

use anyhow::Result;
use sqlx::Row;

use crate::api::{Mode, StageView};
use crate::service::db::{new_id, Db};
use crate::track::Track;

pub const POLICY: &str = "policy";
pub const REVIEW: &str = "review";
pub const BUILD: &str = "build";
/// A CUDA build's kernel modules compiled once, before any worker of it runs.
pub const KERNELS: &str = "kernels";
pub const GATE: &str = "gate";
pub const PRICE: &str = "price";
/// A second pricing on another hidden prompt before a promotion.
pub const CONFIRM: &str = "confirm";
/// A profile run's profile of the candidate, after its pricing, on the same kind of runner
/// (`crate::profile`).
pub const PROFILE: &str = "profile";
/// The service's own row: the verdict, written when the pipeline ends.
pub const VERDICT: &str = "verdict";

/// The clock's verdict when a pricing's interval still straddles the floor at the end of its
/// budget: the noise, not the build, decided it.
pub const INCONCLUSIVE: &str = "infra:inconclusive";

/// The runner kind that builds.
pub const BUILDER: &str = "builder";

/// The stage after `stage` in a submission's pipeline on `track` in `mode` (`None` after the
/// gate of a `test`, which is never priced; after a pricing, the profile of a `profile` run, else
/// `None`: the verdict decides whether a confirmation follows).
pub fn next(stage: &str, track: &Track, mode: Mode) -> Option<&'static str> {
    match stage {
        POLICY => Some(REVIEW),
        REVIEW => Some(BUILD),
        BUILD if track.model.backend == "cuda" => Some(KERNELS),
        BUILD | KERNELS => Some(GATE),
        GATE if mode != Mode::Test => Some(PRICE),
        PRICE if mode == Mode::Profile => Some(PROFILE),
        _ => None,
    }
}

/// Whether a report of `outcome` at `stage` runs that stage once more instead of ending the job
/// (asked before its row is closed): an inconclusive pricing or confirmation, the first time.
/// Back in the queue, it is run again as an expired lease's stage is, its first row kept.
pub async fn runs_again(
    tx: &mut sqlx::AnyConnection,
    submission: &str,
    stage: &str,
    outcome: &str,
) -> Result<bool> {
    if !matches!(stage, PRICE | CONFIRM) || outcome != INCONCLUSIVE {
        return Ok(false);
    }
    let n: i64 = sqlx::query(
        "SELECT COUNT(*) AS n FROM stages WHERE submission = $1 AND stage = $2 AND outcome = $3",
    )
    .bind(submission)
    .bind(stage)
    .bind(outcome)
    .fetch_one(&mut *tx)
    .await?
    .try_get("n")?;
    Ok(n == 0)
}

/// The kind of runner that runs `stage` of a submission on `track`.
pub fn kind(stage: &str, track: &Track) -> String {
    match stage {
        POLICY | REVIEW | BUILD => BUILDER.to_string(),
        _ => track.runner_kind.clone(),
    }
}

/// Opens a stage row (inside the caller's transaction).
pub async fn start(
    tx: &mut sqlx::AnyConnection,
    submission: &str,
    stage: &str,
    runner: Option<&str>,
    now: i64,
) -> Result<String> {
    // Ids sort in the order the rows were opened (nanoseconds, then a random tail).
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let id = format!("{nanos:020}-{}", new_id("st"));
    sqlx::query(
        "INSERT INTO stages (id, submission, stage, runner, started_ms) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(&id)
    .bind(submission)
    .bind(stage)
    .bind(runner)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    Ok(id)
}

/// Closes the open row of `stage` of `submission`.
pub async fn finish(
    tx: &mut sqlx::AnyConnection,
    submission: &str,
    stage: &str,
    outcome: &str,
    detail: &str,
    result: &serde_json::Value,
    now: i64,
) -> Result<()> {
    sqlx::query(
        "UPDATE stages SET ended_ms = $1, outcome = $2, detail = $3, result = $4 \
         WHERE submission = $5 AND stage = $6 AND ended_ms IS NULL",
    )
    .bind(now)
    .bind(outcome)
    .bind(detail)
    .bind(result.to_string())
    .bind(submission)
    .bind(stage)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Closes whatever row of `submission` is still open (its lease expired: the runner is gone).
pub async fn abandon(tx: &mut sqlx::AnyConnection, submission: &str, now: i64) -> Result<()> {
    sqlx::query(
        "UPDATE stages SET ended_ms = $1, outcome = 'infra:lease_expired', \
         detail = 'the runner stopped reporting; the stage runs again' \
         WHERE submission = $2 AND ended_ms IS NULL",
    )
    .bind(now)
    .bind(submission)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// A stage row written whole (the service's own, e.g. the verdict).
pub async fn record(
    tx: &mut sqlx::AnyConnection,
    submission: &str,
    stage: &str,
    outcome: &str,
    detail: &str,
    now: i64,
) -> Result<()> {
    start(tx, submission, stage, None, now).await?;
    finish(
        tx,
        submission,
        stage,
        outcome,
        detail,
        &serde_json::Value::Null,
        now,
    )
    .await
}

/// The private results of the stages of `submission` that ended `ok`, the latest of each.
pub async fn results(
    db: &Db,
    submission: &str,
) -> Result<std::collections::BTreeMap<String, serde_json::Value>> {
    let rows = sqlx::query(
        "SELECT stage, result FROM stages WHERE submission = $1 AND outcome = 'ok' \
         ORDER BY id",
    )
    .bind(submission)
    .fetch_all(&db.pool)
    .await?;
    let mut out = std::collections::BTreeMap::new();
    for r in rows {
        let stage: String = r.try_get("stage")?;
        let result: Option<String> = r.try_get("result")?;
        let v = result
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or(serde_json::Value::Null);
        out.insert(stage, v);
    }
    Ok(out)
}

/// Every stage row of `submission`, in order, with its private result (`null` where the runner
/// kept none), as an operator sees them: `None` when there is no such submission.
pub async fn private(db: &Db, submission: &str) -> Result<Option<Vec<serde_json::Value>>> {
    let known = sqlx::query("SELECT id FROM submissions WHERE id = $1")
        .bind(submission)
        .fetch_optional(&db.pool)
        .await?;
    if known.is_none() {
        return Ok(None);
    }
    let rows = sqlx::query(&format!("{STAGE_ROWS}, result {FROM_STAGES}"))
        .bind(submission)
        .fetch_all(&db.pool)
        .await?;
    rows.iter()
        .map(|r| {
            let mut v = serde_json::to_value(view(r)?)?;
            let result: Option<String> = r.try_get("result")?;
            v["result"] = result
                .and_then(|s| serde_json::from_str(&s).ok())
                .unwrap_or(serde_json::Value::Null);
            Ok(v)
        })
        .collect::<Result<_>>()
        .map(Some)
}

/// Every stage row of `submission`, in order, as the public sees them.
pub async fn list(db: &Db, submission: &str) -> Result<Vec<StageView>> {
    let rows = sqlx::query(&format!("{STAGE_ROWS} {FROM_STAGES}"))
        .bind(submission)
        .fetch_all(&db.pool)
        .await?;
    rows.iter().map(view).collect()
}

/// The public columns of a stage row (`private` adds its result) and where they come from.
const STAGE_ROWS: &str = "SELECT stage, runner, started_ms, ended_ms, outcome, detail";
const FROM_STAGES: &str = "FROM stages WHERE submission = $1 ORDER BY id";

fn view(r: &sqlx::any::AnyRow) -> Result<StageView> {
    Ok(StageView {
        stage: r.try_get("stage")?,
        runner: r.try_get("runner")?,
        started_ms: r.try_get("started_ms")?,
        ended_ms: r.try_get("ended_ms")?,
        outcome: r.try_get("outcome")?,
        detail: r.try_get("detail")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn track(name: &str) -> Track {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tracks");
        crate::track::load_dir(&dir).unwrap().remove(name).unwrap()
    }

    /// The stages each mode runs, in order, from policy to where `next` ends it.
    fn pipeline(track: &Track, mode: Mode) -> Vec<&'static str> {
        let mut out = vec![POLICY];
        while let Some(n) = next(out[out.len() - 1], track, mode) {
            out.push(n);
        }
        out
    }

    #[test]
    fn a_test_ends_at_its_gate_and_the_other_modes_are_priced() {
        let cpu = track("serial-tiny");
        let gate = [POLICY, REVIEW, BUILD, GATE];
        assert_eq!(pipeline(&cpu, Mode::Test), gate);
        for mode in [Mode::Benchmark, Mode::Leaderboard] {
            assert_eq!(pipeline(&cpu, mode), [&gate[..], &[PRICE]].concat());
        }
        assert_eq!(
            pipeline(&cpu, Mode::Profile),
            [&gate[..], &[PRICE, PROFILE]].concat()
        );
        assert_eq!(kind(PROFILE, &cpu), cpu.runner_kind);
        let mut cuda = cpu.clone();
        cuda.model.backend = "cuda".into();
        assert_eq!(
            pipeline(&cuda, Mode::Test),
            [POLICY, REVIEW, BUILD, KERNELS, GATE]
        );
    }
}
