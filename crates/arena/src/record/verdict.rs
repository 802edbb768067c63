//! What the service does with a stage's report: record it, move the job on, and when the
//! pipeline ends write the verdict (passed with score, interval and the original's metric
//! names; or a failure category, the step already bucketed to 32 by the runner). A passed
//! submission whose interval clears the current best by the track's margin gets a
//! confirmation pricing, and is promoted when that clears it too (`promotion`). A private
//! run ends sooner (`api::Mode`): a `test` after its gate (`tested`), a `benchmark` after its
//! pricing (`benchmarked`, its score beside the current best), a `profile` run after its
//! profile (`profiled`: the same, and its profile stored for its solver), none of them
//! confirmed or promoted.

use anyhow::{Context, Result};
use axum::http::StatusCode;
use serde_json::{json, Value};
use sqlx::Row;

use crate::api::{Mode, Report};
use crate::profile::Profile;
use crate::record::promotion;
use crate::service::caps::Blame;
use crate::service::db::now_ms;
use crate::service::{current_base, lease, stages, ApiError, Service};
use crate::track::Track;

/// The status of a `test` that passed its gate.
pub const TESTED: &str = "tested";
/// The status of a `benchmark` priced.
pub const BENCHMARKED: &str = "benchmarked";
/// The status of a `profile` run priced and profiled.
pub const PROFILED: &str = "profiled";

/// The lower end of a pricing's interval, from its private result.
fn ci_low(result: &Value) -> Option<f64> {
    result["metrics"]["ci95"][0].as_f64()
}

/// Records `rep`; returns the (lease, stage) the reporting runner keeps, if any.
pub async fn on_report(
    s: &Service,
    runner: &str,
    kind: &str,
    rep: &Report,
) -> Result<Option<(String, String)>, ApiError> {
    let r = Reporting {
        s,
        runner,
        kind,
        rep,
        now: now_ms(),
    };
    let mut tx = s.db.write().await?;
    if !lease::holds(
        &mut tx,
        s.db.backend,
        &rep.submission,
        &rep.lease_id,
        &rep.stage,
    )
    .await?
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "the lease is lost (expired and taken by another runner, finished, or cancelled)",
        ));
    }
    let again = r.finish_stage(&mut tx).await?;
    let (track, mode) = r.track(&mut tx).await?;
    if again {
        let k = stages::kind(&rep.stage, track);
        lease::advance(&mut tx, &rep.submission, &rep.stage, &k, None, r.now).await?;
        tx.commit().await?;
        return Ok(None);
    }
    // A profile run's profile ends it whatever the profile stage's outcome: its pricing stands.
    if rep.stage == stages::PROFILE {
        r.profiled(&mut tx, track).await?;
        tx.commit().await?;
        return Ok(None);
    }
    if rep.outcome != "ok" && !r.unconfirmed() {
        let blame = Blame::of(&rep.outcome, rep.candidate_caused);
        let failure = (
            rep.stage.as_str(),
            rep.outcome.as_str(),
            rep.detail.as_str(),
        );
        fail(&mut tx, &rep.submission, failure, blame, r.now).await?;
        tx.commit().await?;
        return Ok(None);
    }
    let kept = match stages::next(&rep.stage, track, mode).filter(|_| !r.unconfirmed()) {
        Some(next) => {
            let next_kind = stages::kind(next, track);
            let keep = next_kind == kind || (rep.builder && next_kind == stages::BUILDER);
            r.hand_on(&mut tx, next, &next_kind, keep).await?
        }
        None => match mode {
            Mode::Test => r.tested(&mut tx).await.map(|()| None)?,
            Mode::Benchmark | Mode::Profile => {
                r.benchmarked(&mut tx, track).await.map(|()| None)?
            }
            Mode::Leaderboard => r.after_pricing(&mut tx, track).await?,
        },
    };
    tx.commit().await?;
    Ok(kept)
}

/// A runner's report being recorded: the service, the runner and its kind, the report, and
/// when it came.
struct Reporting<'a> {
    s: &'a Service,
    runner: &'a str,
    kind: &'a str,
    rep: &'a Report,
    now: i64,
}

impl<'a> Reporting<'a> {
    /// A confirmation that cannot confirm (inconclusive twice, a crashed worker) leaves a passed
    /// submission held, not failed: its first pricing stands.
    fn unconfirmed(&self) -> bool {
        self.rep.stage == stages::CONFIRM && self.rep.outcome != "ok"
    }

    /// Closes the reported stage's row, and registers the builds a build stage made. Returns
    /// whether the stage runs again (a pricing inconclusive once).
    async fn finish_stage(&self, tx: &mut sqlx::AnyConnection) -> Result<bool, ApiError> {
        let rep = self.rep;
        let again = stages::runs_again(tx, &rep.submission, &rep.stage, &rep.outcome).await?;
        let detail = if again {
            format!("{}; inconclusive once: this stage runs again", rep.detail)
        } else {
            rep.detail.clone()
        };
        stages::finish(
            tx,
            &rep.submission,
            &rep.stage,
            &rep.outcome,
            &detail,
            &rep.result,
            self.now,
        )
        .await?;
        if rep.stage == stages::BUILD && rep.outcome == "ok" {
            for b in rep.result["builds"].as_array().into_iter().flatten() {
                let (Some(k), Some(a)) = (b["build_key"].as_str(), b["artifact"].as_str()) else {
                    continue;
                };
                sqlx::query(
                    "INSERT INTO builds (build_key, artifact, created_ms) VALUES ($1, $2, $3) \
                     ON CONFLICT (build_key) DO NOTHING",
                )
                .bind(k)
                .bind(a)
                .bind(self.now)
                .execute(&mut *tx)
                .await?;
            }
        }
        Ok(again)
    }

    /// The track and mode of the reported submission.
    async fn track(&self, tx: &mut sqlx::AnyConnection) -> Result<(&'a Track, Mode), ApiError> {
        let row = sqlx::query("SELECT track, mode FROM submissions WHERE id = $1")
            .bind(&self.rep.submission)
            .fetch_one(&mut *tx)
            .await?;
        let track_name: String = row.try_get("track")?;
        let track = self
            .s
            .tracks
            .get(&track_name)
            .with_context(|| format!("track {track_name} is no longer loaded"))?;
        Ok((track, crate::record::mode_of(&row)?))
    }

    /// The end of a `test` that passed its gate: `tested`, nothing priced.
    async fn tested(&self, tx: &mut sqlx::AnyConnection) -> Result<(), ApiError> {
        let v = json!({"status": TESTED});
        let why = "tested: it passed the gate (public and hidden goldens); a test is not priced";
        self.conclude(tx, TESTED, None, &v, why).await
    }

    /// The end of a `benchmark` after its pricing: `benchmarked` with its score, beside the
    /// current best it was priced against; never confirmed, promoted or ranked.
    async fn benchmarked(
        &self,
        tx: &mut sqlx::AnyConnection,
        track: &Track,
    ) -> Result<(), ApiError> {
        let (_, best, _) = current_base(&self.s.db, &track.name).await?;
        let m = &self.rep.result["metrics"];
        let v = json!({
            "status": BENCHMARKED,
            "score": m["score"],
            "ci95": m["ci95"],
            "metrics": m,
            "current_best": best,
        });
        let why = match m["score"].as_f64() {
            Some(score) => format!(
                "benchmarked: score {score:.4} against the current best {best:.4}; a benchmark \
                 is never promoted or ranked"
            ),
            None => "benchmarked; a benchmark is never promoted or ranked".into(),
        };
        self.conclude(tx, BENCHMARKED, m["score"].as_f64(), &v, &why)
            .await
    }

    /// The end of a `profile` run after its profile stage: its profile stored (checked again;
    /// when the stage failed or its profile is out of bounds, a profile that says so), then
    /// `profiled` with its pricing's score beside the current best, as a benchmark's.
    async fn profiled(&self, tx: &mut sqlx::AnyConnection, track: &Track) -> Result<(), ApiError> {
        let rep = self.rep;
        let unavailable = |why: String| {
            Profile::unavailable(&track.model.backend, track.window.prompt_tokens, &why)
        };
        let profile = if rep.outcome == "ok" {
            match serde_json::from_value::<Profile>(rep.result["profile"].clone()) {
                Ok(p) => match p.check() {
                    Ok(()) => p,
                    Err(e) => unavailable(format!("the service refused the profile: {e}")),
                },
                Err(_) => unavailable("the runner reported no profile".into()),
            }
        } else {
            unavailable(format!(
                "no profile: the profile stage ended {}",
                rep.outcome
            ))
        };
        sqlx::query(
            "INSERT INTO profiles (submission, profile, created_ms) VALUES ($1, $2, $3) \
             ON CONFLICT (submission) DO UPDATE SET profile = EXCLUDED.profile, \
             created_ms = EXCLUDED.created_ms",
        )
        .bind(&rep.submission)
        .bind(serde_json::to_string(&profile).context("the profile as JSON")?)
        .bind(self.now)
        .execute(&mut *tx)
        .await?;
        let (_, best, _) = current_base(&self.s.db, &track.name).await?;
        let results = stages::results(&self.s.db, &rep.submission).await?;
        let m = &results.get(stages::PRICE).unwrap_or(&Value::Null)["metrics"];
        let v = json!({
            "status": PROFILED,
            "score": m["score"],
            "ci95": m["ci95"],
            "metrics": m,
            "current_best": best,
        });
        let got = match (profile.decode.len(), profile.timeline.is_some()) {
            (0, _) => "no per-op times (its profile says why)".to_string(),
            (n, true) => format!("per-op times of {n} op(s) and a kernel timeline for its solver"),
            (n, false) => format!("per-op times of {n} op(s) for its solver"),
        };
        let why = format!(
            "profiled: score {} against the current best {best:.4}; {got}; a profile run is \
             never promoted or ranked",
            m["score"]
                .as_f64()
                .map_or("-".into(), |s| format!("{s:.4}")),
        );
        self.conclude(tx, PROFILED, m["score"].as_f64(), &v, &why)
            .await
    }

    /// Writes the verdict `v` (`status`, the pricing's `score` if any, `why` on its row) and
    /// ends the job.
    async fn conclude(
        &self,
        tx: &mut sqlx::AnyConnection,
        status: &str,
        score: Option<f64>,
        v: &Value,
        why: &str,
    ) -> Result<(), ApiError> {
        let id = &self.rep.submission;
        sqlx::query(
            "UPDATE submissions SET status = $1, score = $2, verdict = $3, \
             finished_ms = $4 WHERE id = $5",
        )
        .bind(status)
        .bind(score)
        .bind(v.to_string())
        .bind(self.now)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        stages::record(tx, id, stages::VERDICT, status, why, self.now).await?;
        lease::end(tx, id).await?;
        Ok(())
    }

    /// Moves the job on to `stage`, which runners of `stage_kind` run; the reporting runner
    /// keeps the job, under its lease, when `keep`. Returns the (lease, stage) it keeps.
    async fn hand_on(
        &self,
        tx: &mut sqlx::AnyConnection,
        stage: &str,
        stage_kind: &str,
        keep: bool,
    ) -> Result<Option<(String, String)>, ApiError> {
        lease::advance(
            tx,
            &self.rep.submission,
            stage,
            stage_kind,
            keep.then_some((self.runner, self.s.lease_ms)),
            self.now,
        )
        .await?;
        Ok(keep.then(|| (self.rep.lease_id.clone(), stage.to_string())))
    }

    /// The pipeline's end, after a pricing: a first pricing whose interval clears the current
    /// best by the track's margin goes on to its confirmation; else the verdict is written
    /// (`pass`).
    async fn after_pricing(
        &self,
        tx: &mut sqlx::AnyConnection,
        track: &Track,
    ) -> Result<Option<(String, String)>, ApiError> {
        let rep = self.rep;
        let (_, best, _) = current_base(&self.s.db, &track.name).await?;
        let bar = best * (1.0 + track.promotion.margin);
        let results = stages::results(&self.s.db, &rep.submission).await?;
        let price = if rep.stage == stages::PRICE {
            &rep.result
        } else {
            results.get(stages::PRICE).unwrap_or(&Value::Null)
        };
        let clears = |r: &Value| ci_low(r).is_some_and(|lo| lo > bar);
        if rep.stage == stages::PRICE && clears(price) {
            let k = stages::kind(stages::CONFIRM, track);
            let keep = k == self.kind;
            return self.hand_on(tx, stages::CONFIRM, &k, keep).await;
        }
        let confirmed = rep.stage == stages::CONFIRM && clears(&rep.result);
        self.pass(tx, track, price, best, confirmed).await?;
        Ok(None)
    }

    /// Writes the verdict of a submission that passed, priced by `price`: promoted when its
    /// confirmation cleared the current `best` and the promotion went through, else held, with
    /// why.
    async fn pass(
        &self,
        tx: &mut sqlx::AnyConnection,
        track: &Track,
        price: &Value,
        best: f64,
        confirmed: bool,
    ) -> Result<(), ApiError> {
        let rep = self.rep;
        let mut v = json!({
            "status": "held",
            "score": price["metrics"]["score"],
            "ci95": price["metrics"]["ci95"],
            "metrics": price["metrics"],
        });
        if rep.stage == stages::CONFIRM {
            v["confirmation"] = rep.result["metrics"].clone();
        }
        let why = if confirmed {
            match promotion::promote(self.s, tx, track, &rep.submission, &v, self.now).await? {
                Ok(commit) => {
                    v["status"] = json!("promoted");
                    v["base_commit"] = json!(commit);
                    format!("promoted: the new base of {} is {commit}", track.name)
                }
                Err(why) => {
                    v["not_promoted"] = json!(why);
                    format!("passed, held: {why}")
                }
            }
        } else if rep.stage == stages::CONFIRM {
            let w = if self.unconfirmed() {
                format!(
                    "passed, held: the confirmation pricing ended {}",
                    rep.outcome
                )
            } else {
                format!(
                    "passed, held: the confirmation pricing's interval does not clear \
                     the current best {best:.4} by the margin {}",
                    track.promotion.margin
                )
            };
            v["not_promoted"] = json!(w);
            w
        } else {
            format!("passed, held: the interval does not clear the current best {best:.4}")
        };
        let status = v["status"].as_str().unwrap_or("held").to_string();
        let score = price["metrics"]["score"].as_f64();
        self.conclude(tx, &status, score, &v, &why).await
    }
}

/// Ends `submission` as failed at (stage, category, public detail), whose failure it is for the
/// daily cap (`caps`) recorded with it.
pub async fn fail(
    tx: &mut sqlx::AnyConnection,
    submission: &str,
    (stage, category, detail): (&str, &str, &str),
    blame: Blame,
    now: i64,
) -> Result<()> {
    let v = json!({"status": "failed", "stage": stage, "category": category, "detail": detail});
    sqlx::query(
        "UPDATE submissions SET status = 'failed', category = $1, attributable = $2, \
         candidate_caused = $3, verdict = $4, finished_ms = $5 WHERE id = $6",
    )
    .bind(category)
    .bind(i64::from(blame == Blame::Solver))
    .bind(i64::from(blame == Blame::Candidate))
    .bind(v.to_string())
    .bind(now)
    .bind(submission)
    .execute(&mut *tx)
    .await?;
    stages::record(
        tx,
        submission,
        stages::VERDICT,
        "failed",
        &format!("{category} at {stage}: {detail}"),
        now,
    )
    .await?;
    lease::end(tx, submission).await
}
