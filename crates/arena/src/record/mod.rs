//! The public record: every query the JSON API and the pages read (one source of truth for the
//! ranking, the frontier, the queue and a submission's history). Nothing here reads hidden
//! material: stage results are private, and only the pairs' scores are taken from the pricing's
//! (ratios of timings, what the clock's own pairs plot shows).
//!
//! This folder is what writes the record: `verdict` (a stage's report recorded, the job moved
//! on, the verdict written), `promotion` (a confirmed winner becomes its track's base),
//! `cancel` (an operator's cancel of a job), `notes` (a submission's note, bounded and rendered
//! once) and `metrics` (the metrics a pricing keeps, and how a person reads one).

pub mod cancel;
pub mod metrics;
pub mod notes;
pub mod promotion;
pub mod verdict;

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::Value;
use sqlx::Row;

use crate::api::{
    FrontierPoint, LeaderboardRow, LedgerRow, LocalResult, MachineTransfer, Mode, PairPoint,
    PricingRow, QueueRow, Rules, SubmissionList, SubmissionSummary, SubmissionView, TrackView,
};
use crate::service::db::{now_ms, Db};
use crate::service::{current_base, lease, stages, Service};
use crate::store::Store;

/// The statuses a submission can have (what `?status=` accepts, with `cheat`).
pub const STATUSES: &[&str] = &[
    "queued",
    "running",
    "held",
    "promoted",
    "repriced",
    "failed",
    verdict::TESTED,
    verdict::BENCHMARKED,
    verdict::PROFILED,
];

/// The statuses that rank: passed and priced (held, promoted, or held then re-priced).
const RANKED: &str = "('held', 'promoted', 'repriced')";

/// A row's `mode` column.
pub fn mode_of(r: &sqlx::any::AnyRow) -> Result<Mode> {
    let m: String = r.try_get("mode")?;
    Mode::parse(&m).with_context(|| format!("mode {m:?}: not a mode"))
}

/// A row's `local_result` column: the solver's local pricing as intake checked and wrote it.
fn local_of(r: &sqlx::any::AnyRow) -> Result<Option<LocalResult>> {
    let v: Option<String> = r.try_get("local_result")?;
    Ok(v.and_then(|v| serde_json::from_str(&v).ok()))
}

/// The transfer ledger of `track` (issue 49): each leaderboard submission that carried a local
/// result and has the arena's score, not marked a cheat, oldest first. Private runs are never in
/// it (their local results are their solvers' only, on their own pages).
pub async fn ledger(db: &Db, track: &str) -> Result<Vec<LedgerRow>> {
    ledger_rows(db, "track = $1 AND mode = 'leaderboard'", track).await
}

/// The same of one solver over every track; with `own` (the solver reads its own), its priced
/// private runs (`benchmark`, `profile`) too.
pub async fn solver_ledger(db: &Db, solver: &str, own: bool) -> Result<Vec<LedgerRow>> {
    let cond = if own {
        "solver = $1"
    } else {
        "solver = $1 AND mode = 'leaderboard'"
    };
    ledger_rows(db, cond, solver).await
}

/// The ledger's rows that `cond` (its one placeholder bound to `value`) selects among those
/// with a local result, the arena's score and no cheat mark, oldest first.
async fn ledger_rows(db: &Db, cond: &str, value: &str) -> Result<Vec<LedgerRow>> {
    let sql = format!(
        "SELECT id, solver, track, mode, status, score, verdict, local_result, created_ms \
         FROM submissions WHERE {cond} AND local_result IS NOT NULL AND score IS NOT NULL \
         AND cheat_reason IS NULL ORDER BY created_ms, id"
    );
    let rows = sqlx::query(&sql).bind(value).fetch_all(&db.pool).await?;
    let mut out = vec![];
    for r in rows {
        let Some(local) = local_of(&r)? else { continue };
        out.push(LedgerRow {
            submission: r.try_get("id")?,
            solver: r.try_get("solver")?,
            track: r.try_get("track")?,
            mode: mode_of(&r)?,
            local,
            ranked_score: r.try_get("score")?,
            ranked_ci95: ci_of(&verdict_json(r.try_get("verdict")?)),
            status: r.try_get("status")?,
            created_ms: r.try_get("created_ms")?,
        });
    }
    Ok(out)
}

/// How each local machine of `rows` transferred, per track (`MachineTransfer`), in the order of
/// each one's first row.
pub fn machines(rows: &[LedgerRow]) -> Vec<MachineTransfer> {
    let mut out: Vec<(MachineTransfer, f64)> = vec![];
    for r in rows {
        let machine = r.local.machine_line();
        let ratio = r.ranked_score / r.local.score;
        let [lo, hi] = r.local.ci95;
        let within = u64::from((lo..=hi).contains(&r.ranked_score));
        match out
            .iter_mut()
            .find(|(m, _)| m.track == r.track && m.machine == machine)
        {
            Some((m, log_sum)) => {
                m.rows += 1;
                *log_sum += ratio.ln();
                m.ratio_min = m.ratio_min.min(ratio);
                m.ratio_max = m.ratio_max.max(ratio);
                m.within_local_ci += within;
            }
            None => out.push((
                MachineTransfer {
                    track: r.track.clone(),
                    machine,
                    rows: 1,
                    ratio_mean: ratio,
                    ratio_min: ratio,
                    ratio_max: ratio,
                    within_local_ci: within,
                },
                ratio.ln(),
            )),
        }
    }
    out.into_iter()
        .map(|(m, log_sum)| MachineTransfer {
            ratio_mean: (log_sum / m.rows as f64).exp(),
            ..m
        })
        .collect()
}

/// Whether `name` shows on the public record: a solver with a leaderboard submission. One with
/// only private runs is as unknown as a name nobody holds, but to itself.
pub async fn solver_is_public(db: &Db, name: &str) -> Result<bool> {
    Ok(
        sqlx::query(
            "SELECT id FROM submissions WHERE solver = $1 AND mode = 'leaderboard' LIMIT 1",
        )
        .bind(name)
        .fetch_optional(&db.pool)
        .await?
        .is_some(),
    )
}

fn verdict_json(v: Option<String>) -> Option<Value> {
    v.and_then(|v| serde_json::from_str(&v).ok())
}

fn ci_of(v: &Option<Value>) -> Option<[f64; 2]> {
    v.as_ref()
        .and_then(|v| serde_json::from_value(v["ci95"].clone()).ok())
}

/// The baseline row, then one per promotion, in order.
pub async fn frontier(db: &Db, track: &str) -> Result<Vec<FrontierPoint>> {
    let rows = sqlx::query(
        "SELECT p.seq, p.submission, p.score, p.created_ms, s.solver FROM promotions p \
         LEFT JOIN submissions s ON s.id = p.submission WHERE p.track = $1 ORDER BY p.seq",
    )
    .bind(track)
    .fetch_all(&db.pool)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(FrontierPoint {
                seq: r.try_get("seq")?,
                submission: r.try_get("submission")?,
                solver: r.try_get("solver")?,
                score: r.try_get("score")?,
                created_ms: r.try_get("created_ms")?,
            })
        })
        .collect()
}

/// The best score before a submission: the one its own promotion replaced, or else the last
/// promotion made before it was judged.
fn best_before(frontier: &[FrontierPoint], id: &str, judged_ms: i64) -> Option<f64> {
    if let Some(i) = frontier
        .iter()
        .position(|p| p.submission.as_deref() == Some(id))
    {
        return i.checked_sub(1).map(|j| frontier[j].score);
    }
    frontier
        .iter()
        .rev()
        .find(|p| p.created_ms <= judged_ms)
        .or(frontier.first())
        .map(|p| p.score)
}

/// What a passed submission ranks by: a promoted one by its score (confirmed by a second
/// pricing); a held one by the least of its score, its confirmation's and the best it was judged
/// against, since it did not show that it beats that best (a held change re-priced on a new base
/// whose score came out above the current best by noise must not outrank it).
fn rank_score(status: &str, score: f64, verdict: &Option<Value>, best: Option<f64>) -> f64 {
    if status == "promoted" {
        return score;
    }
    let confirmation = verdict
        .as_ref()
        .and_then(|v| v["confirmation"]["score"].as_f64());
    [confirmation, best]
        .into_iter()
        .flatten()
        .fold(score, f64::min)
}

/// The ranking: one row per change, its latest passed pricing (a `repriced` submission leaves
/// the ranking to its re-pricing once that passed too), by rank score (`rank_score`; ties: a
/// promoted one first, then the earlier), cheats left out.
pub async fn leaderboard(
    db: &Db,
    track: &str,
    frontier: &[FrontierPoint],
) -> Result<Vec<LeaderboardRow>> {
    let rows = sqlx::query(&format!(
        "SELECT id, solver, model, score, status, created_ms, finished_ms, verdict, reprice_of \
         FROM submissions WHERE track = $1 AND score IS NOT NULL AND status IN {RANKED} \
         AND cheat_reason IS NULL"
    ))
    .bind(track)
    .fetch_all(&db.pool)
    .await?;
    let mut superseded = std::collections::HashSet::new();
    for r in &rows {
        if let Some(of) = r.try_get::<Option<String>, _>("reprice_of")? {
            superseded.insert(of);
        }
    }
    let mut ranked: Vec<LeaderboardRow> = vec![];
    for r in rows {
        let id: String = r.try_get("id")?;
        if superseded.contains(&id) {
            continue;
        }
        let score: f64 = r.try_get("score")?;
        let status: String = r.try_get("status")?;
        let created: i64 = r.try_get("created_ms")?;
        let judged: Option<i64> = r.try_get("finished_ms")?;
        let verdict = verdict_json(r.try_get("verdict")?);
        let best = best_before(frontier, &id, judged.unwrap_or(created));
        ranked.push(LeaderboardRow {
            rank: 0,
            gap_to_above: None,
            solver: r.try_get("solver")?,
            model: r.try_get("model")?,
            score,
            rank_score: rank_score(&status, score, &verdict, best),
            ci95: ci_of(&verdict),
            gain: best.map(|b| score / b - 1.0),
            status,
            created_ms: created,
            submission: id,
        });
    }
    ranked.sort_by(|a, b| {
        b.rank_score
            .total_cmp(&a.rank_score)
            .then_with(|| (b.status == "promoted").cmp(&(a.status == "promoted")))
            .then_with(|| a.created_ms.cmp(&b.created_ms))
            .then_with(|| a.submission.cmp(&b.submission))
    });
    let mut above: Option<f64> = None;
    for (i, r) in ranked.iter_mut().enumerate() {
        r.rank = i + 1;
        r.gap_to_above = above.map(|a| a - r.rank_score);
        above = Some(r.rank_score);
    }
    Ok(ranked)
}

/// The track's unfinished submissions, oldest first (a private run without its id or solver).
pub async fn queue(db: &Db, track: &str) -> Result<Vec<QueueRow>> {
    let rows = sqlx::query(
        "SELECT id, solver, mode, next_stage, next_kind, lease_runner, lease_id, created_ms \
         FROM submissions WHERE track = $1 AND next_stage IS NOT NULL ORDER BY created_ms, id",
    )
    .bind(track)
    .fetch_all(&db.pool)
    .await?;
    let mut out = vec![];
    for r in rows {
        let id: String = r.try_get("id")?;
        let lease: Option<String> = r.try_get("lease_id")?;
        let private = mode_of(&r)?.private();
        let solver: String = r.try_get("solver")?;
        // A private run is in the queue, where it waits and what it holds, but not whose or
        // which it is.
        let (submission, solver) = if private {
            (String::new(), String::new())
        } else {
            (id.clone(), solver)
        };
        out.push(QueueRow {
            position: lease::queue_position(db, &id).await?,
            runner: if lease.is_some() {
                r.try_get("lease_runner")?
            } else {
                None
            },
            solver,
            private,
            stage: r.try_get("next_stage")?,
            kind: r
                .try_get::<Option<String>, _>("next_kind")?
                .unwrap_or_default(),
            created_ms: r.try_get("created_ms")?,
            submission,
        });
    }
    Ok(out)
}

/// A track as the public sees it: rules, base, best score and metrics, ranking, frontier, queue.
pub async fn track_view(s: &Service, name: &str) -> Result<TrackView> {
    let t = s
        .tracks
        .get(name)
        .with_context(|| format!("no track {name}"))?;
    let (base, best, by) = current_base(&s.db, name).await?;
    let mut metrics = None;
    if let Some(id) = &by {
        let r = sqlx::query("SELECT verdict FROM submissions WHERE id = $1")
            .bind(id)
            .fetch_one(&s.db.pool)
            .await?;
        metrics = verdict_json(r.try_get("verdict")?).map(|v| v["metrics"].clone());
    }
    let frontier = frontier(&s.db, name).await?;
    Ok(TrackView {
        name: t.name.clone(),
        description: t.description.clone(),
        runner_kind: t.runner_kind.clone(),
        clock_track: t.clock_track.clone(),
        surface: t.surface.clone(),
        baseline: t.baseline.clone(),
        current_base: base,
        baseline_score: 1.0,
        current_best_score: best,
        current_best_metrics: metrics,
        publish_code: t.publish_code.clone(),
        rules: Rules {
            prompt_tokens: t.window.prompt_tokens,
            decode_tokens: t.window.decode_tokens,
            block_size: (t.clock_track == "dflash").then_some(t.window.block_size),
            floor: t.clock.floor,
            target_ci: t.clock.target_ci,
            min_pairs: t.clock.min_pairs,
            max_pairs: t.clock.max_pairs,
            promotion_margin: t.promotion.margin,
        },
        leaderboard: leaderboard(&s.db, name, &frontier).await?,
        queue: queue(&s.db, name).await?,
        frontier,
    })
}

/// What `GET /api/submissions` filters on; every field checked before any query.
#[derive(Debug, Default, Clone)]
pub struct Filter {
    pub track: Option<String>,
    pub solver: Option<String>,
    /// One of `STATUSES`, or `cheat` (marked by an operator, whatever its status).
    pub status: Option<String>,
    /// From 1.
    pub page: u64,
    pub per_page: u64,
    /// The solver whose private runs the list may hold too (its own token); `None`: the
    /// public, who see leaderboard submissions only.
    pub viewer: Option<String>,
}

/// The most a page may hold.
pub const MAX_PER_PAGE: u64 = 200;

impl Filter {
    /// From the query string's values, naming the parameter at fault.
    pub fn parse(
        track: Option<String>,
        solver: Option<String>,
        status: Option<String>,
        page: Option<String>,
        per_page: Option<String>,
    ) -> Result<Filter> {
        let number = |v: Option<String>, name: &str, default: u64, max: u64| -> Result<u64> {
            match v {
                None => Ok(default),
                Some(v) => match v.parse::<u64>() {
                    Ok(n) if (1..=max).contains(&n) => Ok(n),
                    _ => bail!("{name}={v:?}: a whole number from 1 to {max}"),
                },
            }
        };
        if let Some(s) = &status {
            if s != "cheat" && !STATUSES.contains(&s.as_str()) {
                bail!("status={s:?}: one of {}, cheat", STATUSES.join(", "));
            }
        }
        Ok(Filter {
            track,
            solver,
            status,
            page: number(page, "page", 1, u64::MAX >> 1)?,
            per_page: number(per_page, "per_page", 50, MAX_PER_PAGE)?,
            viewer: None,
        })
    }

    /// The same as `viewer` sees it.
    pub fn seen_by(self, viewer: Option<String>) -> Filter {
        Filter { viewer, ..self }
    }
}

/// One page of submissions matching `f`, newest first, and how many match in all.
pub async fn submissions(db: &Db, f: &Filter) -> Result<SubmissionList> {
    // Placeholders are numbered as the conditions are added; the values are bound in order.
    let mut cond = vec![];
    let mut vals: Vec<String> = vec![];
    for (col, v) in [("track", &f.track), ("solver", &f.solver)] {
        if let Some(v) = v {
            vals.push(v.clone());
            cond.push(format!("{col} = ${}", vals.len()));
        }
    }
    // A private run only in its own solver's list.
    match &f.viewer {
        Some(v) => {
            vals.push(v.clone());
            cond.push(format!(
                "(mode = 'leaderboard' OR solver = ${})",
                vals.len()
            ));
        }
        None => cond.push("mode = 'leaderboard'".into()),
    }
    match f.status.as_deref() {
        Some("cheat") => cond.push("cheat_reason IS NOT NULL".into()),
        Some(s) => {
            vals.push(s.to_string());
            cond.push(format!("status = ${}", vals.len()));
        }
        None => {}
    }
    let cond = if cond.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", cond.join(" AND "))
    };
    // A plain COUNT(*): both databases agree on its type (BIGINT).
    let count_sql = format!("SELECT COUNT(*) FROM submissions{cond}");
    let mut count = sqlx::query_scalar::<_, i64>(&count_sql);
    for v in &vals {
        count = count.bind(v.clone());
    }
    let total = count.fetch_one(&db.pool).await?;
    let offset = (f.page - 1).saturating_mul(f.per_page).min(i64::MAX as u64) as i64;
    let sql = format!(
        "SELECT id, solver, track, model, mode, status, category, cheat_reason, score, \
         reprice_of, created_ms, local_result FROM submissions{cond} ORDER BY created_ms DESC, id DESC LIMIT {} \
         OFFSET {offset}",
        f.per_page
    );
    let mut q = sqlx::query(&sql);
    for v in &vals {
        q = q.bind(v.clone());
    }
    let rows = q.fetch_all(&db.pool).await?;
    let submissions = rows
        .into_iter()
        .map(|r| {
            Ok(SubmissionSummary {
                id: r.try_get("id")?,
                solver: r.try_get("solver")?,
                track: r.try_get("track")?,
                model: r.try_get("model")?,
                mode: mode_of(&r)?,
                status: r.try_get("status")?,
                category: r.try_get("category")?,
                cheat: r.try_get("cheat_reason")?,
                score: r.try_get("score")?,
                reprice_of: r.try_get("reprice_of")?,
                created_ms: r.try_get("created_ms")?,
                local_result: local_of(&r)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(SubmissionList {
        submissions,
        page: f.page,
        per_page: f.per_page,
        total,
    })
}

/// The chain of pricings of one change: back through `reprice_of` to the first submission, then
/// forward through each re-pricing.
async fn pricings(db: &Db, id: &str) -> Result<Vec<PricingRow>> {
    let row = |r: sqlx::any::AnyRow| -> Result<(PricingRow, Option<String>)> {
        let v = verdict_json(r.try_get("verdict")?);
        Ok((
            PricingRow {
                submission: r.try_get("id")?,
                base_commit: r.try_get("base_commit")?,
                status: r.try_get("status")?,
                score: r.try_get("score")?,
                ci95: ci_of(&v),
                created_ms: r.try_get("created_ms")?,
            },
            r.try_get("reprice_of")?,
        ))
    };
    let cols = "id, base_commit, status, score, verdict, created_ms, reprice_of";
    let mut first = id.to_string();
    // Bounded: a chain is as long as the track's promotions, and never a cycle (each re-pricing
    // is made after the one it names), but a damaged database must not hang a page.
    for _ in 0..10_000 {
        let r = sqlx::query(&format!("SELECT {cols} FROM submissions WHERE id = $1"))
            .bind(&first)
            .fetch_optional(&db.pool)
            .await?;
        match r.map(row).transpose()? {
            Some((_, Some(up))) => first = up,
            _ => break,
        }
    }
    let mut out = vec![];
    let mut next = Some(first);
    while let Some(cur) = next.take() {
        if out.len() >= 10_000 {
            break;
        }
        let r = sqlx::query(&format!("SELECT {cols} FROM submissions WHERE id = $1"))
            .bind(&cur)
            .fetch_optional(&db.pool)
            .await?;
        let Some(r) = r else { break };
        out.push(row(r)?.0);
        next = sqlx::query(
            "SELECT id FROM submissions WHERE reprice_of = $1 ORDER BY created_ms DESC, id LIMIT 1",
        )
        .bind(&cur)
        .fetch_optional(&db.pool)
        .await?
        .map(|r| r.try_get("id"))
        .transpose()?;
    }
    Ok(out)
}

/// The pairs of the pricing and of the confirmation pricing, each as its stage (ended `ok`)
/// recorded them: two measurements, never one mixed series.
async fn pairs(db: &Db, id: &str) -> Result<(Vec<PairPoint>, Vec<PairPoint>)> {
    let results = stages::results(db, id).await?;
    let of = |stage: &str| -> Vec<PairPoint> {
        results
            .get(stage)
            .and_then(|r| r["pairs"].as_array())
            .into_iter()
            .flatten()
            .filter_map(|p| {
                Some(PairPoint {
                    score: p["score"].as_f64()?,
                    accepted: p["accepted"].as_bool().unwrap_or(false),
                    candidate_first: p["candidate_first"].as_bool().unwrap_or(false),
                })
            })
            .collect()
    };
    Ok((of(stages::PRICE), of(stages::CONFIRM)))
}

/// The change as a unified diff of each file against its base.
fn diff(store: &Store, repo: &Path, digest: &str, base: &str) -> Result<String> {
    let mut out = String::new();
    for (path, data, _) in promotion::bundle_files(store, digest)? {
        let old = crate::git::contents(repo, base, &path)?.unwrap_or_default();
        let (old, new) = (
            String::from_utf8_lossy(&old),
            String::from_utf8_lossy(&data),
        );
        let d = similar::TextDiff::from_lines(old.as_ref(), new.as_ref());
        out += &d
            .unified_diff()
            .context_radius(3)
            .header(&format!("a/{path}"), &format!("b/{path}"))
            .to_string();
    }
    Ok(out)
}

/// The profile of a profile run `id` (none before its profile stage, or of another mode): as the
/// service checked and stored it. Private: the caller shows it to the run's solver only.
pub async fn profile(db: &Db, id: &str) -> Result<Option<crate::profile::Profile>> {
    let r = sqlx::query("SELECT profile FROM profiles WHERE submission = $1")
        .bind(id)
        .fetch_optional(&db.pool)
        .await?;
    let Some(r) = r else { return Ok(None) };
    let text: String = r.try_get("profile")?;
    let p: crate::profile::Profile =
        serde_json::from_str(&text).with_context(|| format!("the profile of {id}"))?;
    Ok(Some(p))
}

/// `None` when there is no such submission.
pub async fn submission_view(s: &Service, id: &str) -> Result<Option<SubmissionView>> {
    let r = sqlx::query(
        "SELECT id, solver, track, model, claimed_score, note, base_commit, reprice_of, \
         created_ms, mode, status, next_stage, verdict, cheat_reason, bundle_digest, local_result \
         FROM submissions WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(&s.db.pool)
    .await?;
    let Some(r) = r else { return Ok(None) };
    let repriced_as = sqlx::query(
        "SELECT id FROM submissions WHERE reprice_of = $1 ORDER BY created_ms DESC, id LIMIT 1",
    )
    .bind(id)
    .fetch_optional(&s.db.pool)
    .await?
    .map(|r| r.try_get("id"))
    .transpose()?;
    let track: String = r.try_get("track")?;
    let status: String = r.try_get("status")?;
    let base: String = r.try_get("base_commit")?;
    let digest: String = r.try_get("bundle_digest")?;
    let published = match s.tracks.get(&track).map(|t| t.publish_code.as_str()) {
        Some("always") => true,
        Some("after_promotion") => status == "promoted",
        _ => false,
    };
    let code = if published {
        let (store, repo, b) = (s.store.clone(), s.repo.clone(), base.clone());
        Some(
            tokio::task::spawn_blocking(move || diff(&store, &repo, &digest, &b))
                .await
                .context("a blocking task")??,
        )
    } else {
        None
    };
    let (pairs, confirmation_pairs) = pairs(&s.db, id).await?;
    let profile = profile(&s.db, id).await?;
    Ok(Some(SubmissionView {
        profile,
        repriced_as,
        id: r.try_get("id")?,
        solver: r.try_get("solver")?,
        model: r.try_get("model")?,
        claimed_score: r.try_get("claimed_score")?,
        note: r.try_get("note")?,
        reprice_of: r.try_get("reprice_of")?,
        created_ms: r.try_get("created_ms")?,
        mode: mode_of(&r)?,
        cheat: r.try_get("cheat_reason")?,
        queue_position: lease::queue_position(&s.db, id).await?,
        next_stage: r.try_get("next_stage")?,
        verdict: verdict_json(r.try_get("verdict")?),
        stages: stages::list(&s.db, id).await?,
        pricings: pricings(&s.db, id).await?,
        pairs,
        confirmation_pairs,
        code,
        local_result: local_of(&r)?,
        track,
        status,
        base_commit: base,
    }))
}

/// Marks `id` as a cheat (or clears the mark with `None`); false when there is no such
/// submission. Its rows stay: only the ranking leaves it out.
pub async fn mark_cheat(db: &Db, id: &str, reason: Option<&str>) -> Result<bool> {
    let r = sqlx::query("UPDATE submissions SET cheat_reason = $1, cheat_ms = $2 WHERE id = $3")
        .bind(reason)
        .bind(reason.map(|_| now_ms()))
        .bind(id)
        .execute(&db.pool)
        .await?;
    Ok(r.rows_affected() == 1)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::extract::{Path as UrlPath, State};
    use axum::http::StatusCode;

    use super::*;
    use crate::service::testdb::{service, On};

    async fn exec(db: &Db, sql: &str) {
        sqlx::query(sql).execute(&db.pool).await.unwrap();
    }

    /// A finished submission of `solver` on serial-tiny with `score` (`None`: failed).
    async fn submission(
        db: &Db,
        id: &str,
        solver: &str,
        created: i64,
        status: &str,
        score: Option<f64>,
    ) {
        let verdict =
            score.map(|s| format!(r#"{{"score":{s},"ci95":[{},{}]}}"#, s - 0.01, s + 0.01));
        sqlx::query(
            "INSERT INTO submissions (id, solver, track, idempotency_key, note, bundle_digest, \
             base_commit, created_ms, status, score, verdict, finished_ms) \
             VALUES ($1, $2, 'serial-tiny', $1, 'a note', 'sha256:x', 'b', $3, $4, $5, $6, $7)",
        )
        .bind(id)
        .bind(solver)
        .bind(created)
        .bind(status)
        .bind(score)
        .bind(verdict)
        .bind(created + 10)
        .execute(&db.pool)
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn the_ranking_the_frontier_the_queue_and_the_pages_agree_on_sqlite() {
        ranking_frontier_queue_and_pages(On::Sqlite).await;
    }

    #[tokio::test]
    async fn the_ranking_the_frontier_the_queue_and_the_pages_agree_on_postgresql() {
        ranking_frontier_queue_and_pages(On::Postgres).await;
    }

    async fn ranking_frontier_queue_and_pages(on: On) {
        let dir = tempfile::tempdir().unwrap();
        let s = service(dir.path(), on).await;
        let db = &s.db;
        exec(
            db,
            "INSERT INTO promotions (track, seq, submission, base_commit, score, created_ms) \
             VALUES ('serial-tiny', 0, NULL, 'b0', 1.0, 100), ('serial-tiny', 1, 's-fast', 'b1', 1.5, 2010)",
        )
        .await;
        submission(db, "s-noop", "alice", 1000, "repriced", Some(1.01)).await;
        submission(db, "s-fast", "bob", 2000, "promoted", Some(1.5)).await;
        // The no-op re-priced on the promoted base: above the best by noise, and its
        // confirmation below it.
        submission(db, "s-noop2", "alice", 2500, "held", Some(1.53)).await;
        exec(
            db,
            "UPDATE submissions SET reprice_of = 's-noop', verdict = \
             '{\"score\":1.53,\"ci95\":[1.51,1.55],\"confirmation\":{\"score\":1.49}}' \
             WHERE id = 's-noop2'",
        )
        .await;
        submission(db, "s-later", "carol", 3000, "held", Some(1.6)).await;
        submission(db, "s-slow", "dave", 3200, "held", Some(1.2)).await;
        submission(db, "s-cheat", "mallory", 3500, "held", Some(9.0)).await;
        submission(db, "s-bad", "alice", 4000, "failed", None).await;
        assert!(mark_cheat(db, "s-cheat", Some("timed a cached answer"))
            .await
            .unwrap());
        assert!(!mark_cheat(db, "s-none", Some("x")).await.unwrap());
        // Two unfinished: one waiting for a builder, one held by runner r1.
        exec(
            db,
            "INSERT INTO submissions (id, solver, track, idempotency_key, note, bundle_digest, \
             base_commit, created_ms, status, next_stage, next_kind, lease_runner, lease_id, \
             lease_expires_ms) VALUES \
             ('s-run', 'bob', 'serial-tiny', 'k1', 'n', 'd', 'b1', 5000, 'running', 'price', 'cpu', 'r1', 'l1', 99999999999999), \
             ('s-wait', 'carol', 'serial-tiny', 'k2', 'n', 'd', 'b1', 6000, 'queued', 'policy', 'builder', NULL, NULL, NULL)",
        )
        .await;

        let t = track_view(&s, "serial-tiny").await.unwrap();
        let rows: Vec<(&str, f64)> = t
            .leaderboard
            .iter()
            .map(|r| (r.submission.as_str(), r.rank_score))
            .collect();
        // The promoted change first: held ones scoring above it did not show they beat it
        // (s-later judged against 1.5, s-noop2's confirmation 1.49). One row per change (the
        // no-op's re-pricing stands for it), the cheat out, the failed one never ranked.
        assert_eq!(
            rows,
            [
                ("s-fast", 1.5),
                ("s-later", 1.5),
                ("s-noop2", 1.49),
                ("s-slow", 1.2)
            ]
        );
        assert_eq!(t.leaderboard[1].score, 1.6);
        let gain = |i: usize| t.leaderboard[i].gain.unwrap();
        // s-later was judged after the promotion to 1.5; s-fast's own promotion replaced 1.0.
        assert!((gain(0) - 0.5).abs() < 1e-9);
        assert!((gain(1) - (1.6 / 1.5 - 1.0)).abs() < 1e-9);
        assert!((gain(3) - (1.2 / 1.5 - 1.0)).abs() < 1e-9);
        assert_eq!(t.leaderboard[0].gap_to_above, None);
        assert_eq!(t.leaderboard[1].gap_to_above, Some(0.0));
        assert!((t.leaderboard[3].gap_to_above.unwrap() - 0.29).abs() < 1e-9);
        assert_eq!(t.current_best_score, 1.5);
        assert_eq!(t.baseline_score, 1.0);
        assert_eq!(t.frontier.len(), 2);
        assert_eq!(t.frontier[1].solver.as_deref(), Some("bob"));
        let q: Vec<(&str, Option<i64>, Option<&str>)> = t
            .queue
            .iter()
            .map(|q| (q.submission.as_str(), q.position, q.runner.as_deref()))
            .collect();
        assert_eq!(q, [("s-run", None, Some("r1")), ("s-wait", Some(0), None)]);

        // Filters and pages, newest first.
        let f = |solver: Option<&str>, status: Option<&str>, page: u64, per_page: u64| Filter {
            track: None,
            solver: solver.map(String::from),
            status: status.map(String::from),
            page,
            per_page,
            viewer: None,
        };
        let l = submissions(db, &f(Some("alice"), None, 1, 50))
            .await
            .unwrap();
        let ids: Vec<&str> = l.submissions.iter().map(|x| x.id.as_str()).collect();
        assert_eq!((ids, l.total), (vec!["s-bad", "s-noop2", "s-noop"], 3));
        let l = submissions(db, &f(None, None, 2, 3)).await.unwrap();
        let ids: Vec<&str> = l.submissions.iter().map(|x| x.id.as_str()).collect();
        assert_eq!((ids, l.total), (vec!["s-cheat", "s-slow", "s-later"], 9));
        let l = submissions(db, &f(None, Some("cheat"), 1, 50))
            .await
            .unwrap();
        assert_eq!(
            l.submissions[0].cheat.as_deref(),
            Some("timed a cached answer")
        );
        assert_eq!(l.total, 1);
        let l = submissions(db, &f(Some("bob"), Some("held"), 1, 50))
            .await
            .unwrap();
        assert_eq!(l.total, 0);

        // The cheat keeps its page, with the reason; an unknown id is a 404 page.
        let state = Arc::new(s);
        let body = |r: axum::response::Response| async move {
            let status = r.status();
            let b = axum::body::to_bytes(r.into_body(), usize::MAX)
                .await
                .unwrap();
            (status, String::from_utf8(b.to_vec()).unwrap())
        };
        let (st, html) = body(
            crate::server::pages::submission(
                State(state.clone()),
                Default::default(),
                UrlPath("s-cheat".into()),
            )
            .await,
        )
        .await;
        assert_eq!(st, StatusCode::OK);
        assert!(html.contains("marked this submission as a cheat: timed a cached answer"));
        let (st, html) = body(
            crate::server::pages::submission(
                State(state.clone()),
                Default::default(),
                UrlPath("s-nope".into()),
            )
            .await,
        )
        .await;
        assert_eq!(st, StatusCode::NOT_FOUND);
        assert!(html.contains("There is no submission s-nope."), "{html}");
        let (st, html) = body(
            crate::server::pages::track(State(state.clone()), UrlPath("serial-tiny".into())).await,
        )
        .await;
        assert_eq!(st, StatusCode::OK);
        // The page ranks as the API does, and lists both unfinished jobs.
        let at = |id: &str| {
            html.find(&format!(">{id}</a>"))
                .unwrap_or_else(|| panic!("{id}: {html}"))
        };
        assert!(at("s-fast") < at("s-later") && at("s-later") < at("s-noop2"));
        assert!(at("s-noop2") < at("s-slow") && !html.contains(">s-noop</a>"));
        assert!(html.contains("1.6000 <span class=\"capped\""), "{html}");
        assert!(!html.contains(">s-cheat</a>"));
        assert!(html.contains("1 (waiting)") && html.contains(r#"<td class="runner">r1</td>"#));
        // Without JavaScript a page with a running job reloads itself; a finished one does not.
        let refresh = r#"<noscript><meta http-equiv="refresh""#;
        assert!(html.contains(refresh) && html.contains(r#"data-live="1""#));
        let (_, html) = body(
            crate::server::pages::submission(
                State(state.clone()),
                Default::default(),
                UrlPath("s-run".into()),
            )
            .await,
        )
        .await;
        assert!(html.contains(refresh), "{html}");
        let (_, html) = body(
            crate::server::pages::submission(
                State(state.clone()),
                Default::default(),
                UrlPath("s-later".into()),
            )
            .await,
        )
        .await;
        assert!(!html.contains(refresh) && html.contains(r#"data-live="0""#));
    }

    #[tokio::test]
    async fn a_change_keeps_each_of_its_pricings_on_sqlite() {
        pricings_of_a_change(On::Sqlite).await;
    }

    #[tokio::test]
    async fn a_change_keeps_each_of_its_pricings_on_postgresql() {
        pricings_of_a_change(On::Postgres).await;
    }

    async fn pricings_of_a_change(on: On) {
        let dir = tempfile::tempdir().unwrap();
        let s = service(dir.path(), on).await;
        submission(&s.db, "s-a", "alice", 1000, "repriced", Some(1.01)).await;
        submission(&s.db, "s-b", "alice", 2000, "repriced", Some(0.99)).await;
        submission(&s.db, "s-c", "alice", 3000, "held", Some(1.02)).await;
        exec(
            &s.db,
            "UPDATE submissions SET reprice_of = 's-a', base_commit = 'b1' WHERE id = 's-b'",
        )
        .await;
        exec(
            &s.db,
            "UPDATE submissions SET reprice_of = 's-b', base_commit = 'b2' WHERE id = 's-c'",
        )
        .await;
        // From any link of the chain: all three, oldest first, each with its own measurement.
        for id in ["s-a", "s-b", "s-c"] {
            let v = submission_view(&s, id).await.unwrap().unwrap();
            let rows: Vec<(&str, &str, Option<f64>)> = v
                .pricings
                .iter()
                .map(|p| (p.submission.as_str(), p.base_commit.as_str(), p.score))
                .collect();
            assert_eq!(
                rows,
                [
                    ("s-a", "b", Some(1.01)),
                    ("s-b", "b1", Some(0.99)),
                    ("s-c", "b2", Some(1.02))
                ],
                "{id}"
            );
        }
        assert!(submission_view(&s, "s-none").await.unwrap().is_none());
    }

    #[test]
    fn the_list_filter_names_the_parameter_at_fault() {
        let e = |r: Result<Filter>| format!("{:#}", r.unwrap_err());
        let some = |s: &str| Some(s.to_string());
        assert!(e(Filter::parse(None, None, some("won"), None, None)).starts_with("status=\"won\""));
        assert!(e(Filter::parse(None, None, None, some("0"), None)).starts_with("page=\"0\""));
        assert!(
            e(Filter::parse(None, None, None, None, some("201"))).starts_with("per_page=\"201\"")
        );
        assert!(e(Filter::parse(None, None, None, None, some("x"))).contains("1 to 200"));
        let f = Filter::parse(None, some("alice"), some("cheat"), None, None).unwrap();
        assert_eq!((f.page, f.per_page), (1, 50));
    }

    #[test]
    fn each_machine_sums_up_its_rows_per_track_a_ratio_mean_geometric() {
        use crate::api::LocalMachine;
        let row = |track: &str, cpu: &str, local: f64, ranked: f64| LedgerRow {
            submission: "s".into(),
            solver: "alice".into(),
            track: track.into(),
            mode: Mode::Leaderboard,
            local: LocalResult {
                score: local,
                ci95: [local - 0.05, local + 0.05],
                pairs: 12,
                track: "serial".into(),
                machine: LocalMachine {
                    cpu_model: Some(cpu.into()),
                    ..Default::default()
                },
            },
            ranked_score: ranked,
            ranked_ci95: None,
            status: "held".into(),
            created_ms: 0,
        };
        let m = machines(&[
            row("serial-tiny", "EPYC", 2.0, 1.0),
            row("serial-tiny", "Xeon", 1.0, 1.02),
            row("serial-tiny", "EPYC", 1.0, 2.0),
            // The same machine on another track is another line.
            row("dflash-tiny", "EPYC", 1.0, 1.0),
        ]);
        let got: Vec<(&str, &str, u64, u64)> = m
            .iter()
            .map(|m| {
                let t = (m.track.as_str(), m.machine.as_str());
                (t.0, t.1, m.rows, m.within_local_ci)
            })
            .collect();
        assert_eq!(
            got,
            [
                ("serial-tiny", "EPYC", 2, 0),
                ("serial-tiny", "Xeon", 1, 1),
                ("dflash-tiny", "EPYC", 1, 1)
            ]
        );
        // Half and twice: a mean of 1, as a ratio's should be; the range both ends.
        assert!((m[0].ratio_mean - 1.0).abs() < 1e-12, "{m:?}");
        assert_eq!((m[0].ratio_min, m[0].ratio_max), (0.5, 2.0));
        assert!((m[1].ratio_mean - 1.02).abs() < 1e-12);
        assert!(machines(&[]).is_empty());
    }
}
