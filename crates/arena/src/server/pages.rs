//! The public pages, rendered on the server (askama templates in `templates/`), readable without
//! JavaScript: the tracks, a track's leaderboard (rules, best metrics, frontier plot, queue) and a
//! submission (note, as rendered once at intake: `notes`; stages, metrics, pairs plot, verdict,
//! re-pricings, code where published) and a solver (its transfer ledger plotted per track, its
//! machines summed up, its submissions; its private runs to itself only).
//! They read the same queries as the JSON API (`record`). A page with a running job carries
//! `data-live="1"`; `/static/live.js` then fetches the page again every 2 s and swaps the live
//! part in (without the script, a `<noscript>` refresh does the same).

use askama::Template;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};

use crate::api::{LedgerRow, LocalResult, StageView, SubmissionView, TrackView};
use crate::record::{self, notes};
use crate::server::plots::{self, datetime, datetime_seconds};
use crate::service::db::now_ms;
use crate::service::AppState;

/// What a page may load: its own script and nothing from elsewhere; no inline script, so
/// even a note that got past the sanitiser could not run one.
const CSP: &str = "default-src 'none'; script-src 'self'; connect-src 'self'; \
                   style-src 'unsafe-inline'; img-src 'self' data:; base-uri 'none'; \
                   form-action 'none'; frame-ancestors 'none'";

/// The script that follows a running job (see the module's comment).
pub const LIVE_JS: &str = r#"// Follows a running job: fetches this page again every 2 s and swaps its live part in,
// until the page says the job has finished.
(function () {
  function tick() {
    fetch(location.href, { cache: "no-store" })
      .then(function (r) { return r.text(); })
      .then(function (text) {
        var next = new DOMParser().parseFromString(text, "text/html").getElementById("live");
        var cur = document.getElementById("live");
        if (next && cur) { cur.replaceWith(next); }
        if (next && next.dataset.live === "1") { setTimeout(tick, 2000); }
      }, function () { setTimeout(tick, 3000); });
  }
  var live = document.getElementById("live");
  if (live && live.dataset.live === "1") { setTimeout(tick, 2000); }
})();
"#;

fn page(status: StatusCode, body: Result<String, askama::Error>) -> Response {
    match body {
        Ok(html) => {
            let mut r = (status, Html(html)).into_response();
            r.headers_mut().insert(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CSP),
            );
            r.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            r
        }
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("rendering the page: {e}"),
        )
            .into_response(),
    }
}

fn error_page(status: StatusCode, what: String) -> Response {
    page(
        status,
        ErrorPage {
            title: status.canonical_reason().unwrap_or("error").to_string(),
            live: false,
            what,
        }
        .render(),
    )
}

/// A failure of the service itself (the database), as a page.
fn trouble(e: anyhow::Error) -> Response {
    error_page(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}"))
}

/// The answer for a path that names nothing.
pub fn not_found(what: String) -> Response {
    error_page(StatusCode::NOT_FOUND, what)
}

fn f4(v: f64) -> String {
    format!("{v:.4}")
}

fn ci(v: Option<[f64; 2]>) -> String {
    v.map(|[a, b]| format!("[{a:.4}, {b:.4}]"))
        .unwrap_or_else(|| "–".into())
}

fn pct(v: Option<f64>) -> String {
    v.map(|g| format!("{:+.1} %", 100.0 * g))
        .unwrap_or_else(|| "–".into())
}

fn short(commit: &str) -> String {
    commit.chars().take(12).collect()
}

/// One metric of a pricing as a page shows it.
struct MetricRow {
    name: String,
    value: String,
    /// What it means (`metrics::METRICS`); empty for a key an older record has.
    meaning: &'static str,
    /// A number or an interval: set right-aligned in its column, words left.
    numeric: bool,
}

/// A pricing's metrics in `metrics::METRICS`' order (a key it does not know, from an older
/// record, last and unexplained).
fn metrics(v: Option<&serde_json::Value>) -> Vec<MetricRow> {
    use crate::record::metrics::METRICS;
    let Some(m) = v.and_then(|m| m.as_object()) else {
        return vec![];
    };
    let mut rows: Vec<(usize, MetricRow)> = m
        .iter()
        .map(|(k, v)| {
            let at = METRICS.iter().position(|x| x.0 == k);
            let row = MetricRow {
                name: k.clone(),
                value: crate::record::metrics::text(v),
                meaning: at.map_or("", |i| METRICS[i].1),
                numeric: v.is_number() || v.is_array(),
            };
            (at.unwrap_or(usize::MAX), row)
        })
        .collect();
    rows.sort_by_key(|r| r.0);
    rows.into_iter().map(|r| r.1).collect()
}

struct TrackLine {
    name: String,
    description: String,
    best: String,
    entries: usize,
    waiting: usize,
}

#[derive(Template)]
#[template(path = "index.html")]
struct IndexPage {
    title: String,
    live: bool,
    tracks: Vec<TrackLine>,
}

pub async fn index(State(s): State<AppState>) -> Response {
    let mut tracks = vec![];
    for name in s.tracks.keys() {
        match record::track_view(&s, name).await {
            Ok(t) => tracks.push(TrackLine {
                best: f4(t.current_best_score),
                entries: t.leaderboard.len(),
                waiting: t.queue.len(),
                name: t.name,
                description: t.description,
            }),
            Err(e) => return trouble(e),
        }
    }
    page(
        StatusCode::OK,
        IndexPage {
            title: "fastdecode arena".into(),
            live: false,
            tracks,
        }
        .render(),
    )
}

struct RowOut {
    rank: usize,
    id: String,
    solver: String,
    model: String,
    score: String,
    /// What the row ranks by, for the page's order check (`data-rank-score`).
    rank_score: String,
    /// Set when a held row ranks below its own score (`record::rank_score`).
    capped: Option<String>,
    ci: String,
    gain: String,
    gap: String,
    status: String,
    date: String,
}

/// A failed submission on its track's page: what stopped it, in the verdict's category.
struct FailedOut {
    id: String,
    solver: String,
    category: String,
    date: String,
}

/// The most failed submissions a track's page lists (the API pages through all of them).
const FAILED_SHOWN: u64 = 20;

/// A row of the transfer ledger on a track's page: local beside ranked, with the machine.
struct LedgerOut {
    id: String,
    solver: String,
    machine: String,
    local: String,
    ranked: String,
    /// Ranked over local, minus one: how far the local machine misled (negative: it promised
    /// more).
    transfer: String,
    status: String,
}

/// `1.2100 [1.1800, 1.2400]`.
fn score_ci(score: f64, ci95: Option<[f64; 2]>) -> String {
    match ci95 {
        Some(_) => format!("{} {}", f4(score), ci(ci95)),
        None => f4(score),
    }
}

/// A local result in one line: score, interval, pairs, machine (escaped by the template).
fn local_line(l: &LocalResult) -> String {
    format!(
        "{} in {} pairs on {}",
        score_ci(l.score, Some(l.ci95)),
        l.pairs,
        l.machine_line()
    )
}

struct QueueOut {
    /// Empty for a private run (its row says so instead).
    id: String,
    solver: String,
    stage: String,
    kind: String,
    position: String,
    runner: String,
    since: String,
}

#[derive(Template)]
#[template(path = "track.html")]
struct TrackPage {
    title: String,
    live: bool,
    name: String,
    description: String,
    rules: Vec<String>,
    surface: String,
    best: String,
    base: String,
    best_metrics: Vec<MetricRow>,
    rows: Vec<RowOut>,
    frontier_svg: String,
    /// The transfer ledger's plot and rows (none: no public submission carried a local result).
    ledger_svg: Option<String>,
    ledger: Vec<LedgerOut>,
    queue: Vec<QueueOut>,
    failed: Vec<FailedOut>,
    /// All failed submissions of the track (the page lists the newest `FAILED_SHOWN`).
    failed_total: i64,
}

fn rules(t: &TrackView) -> Vec<String> {
    let r = &t.rules;
    let mut out = vec![format!(
        "Window: a {}-token prompt, then {} decoded tokens ({} decoding{}).",
        r.prompt_tokens,
        r.decode_tokens,
        t.clock_track,
        r.block_size
            .map(|k| format!(", blocks of {k}"))
            .unwrap_or_default()
    )];
    out.push(format!(
        "Score: speed-up over the pinned baseline {} (score 1), priced in {} to {} pairs to a \
         ±{:.1} % interval; below the floor {} a change fails.",
        short(&t.baseline),
        r.min_pairs,
        r.max_pairs,
        100.0 * r.target_ci,
        r.floor
    ));
    out.push(format!(
        "Promotion: both pricings' intervals clear the current best by {:.1} %; the output must \
         be exact (public and hidden goldens).",
        100.0 * r.promotion_margin
    ));
    out.push(format!(
        "Runner: {} (builds on a CPU builder). Code published: {}.",
        t.runner_kind,
        match t.publish_code.as_str() {
            "always" => "always",
            "after_promotion" => "after promotion",
            _ => "never",
        }
    ));
    out
}

pub async fn track(State(s): State<AppState>, Path(name): Path<String>) -> Response {
    if !s.tracks.contains_key(&name) {
        return not_found(format!("There is no track {name}."));
    }
    let t = match record::track_view(&s, &name).await {
        Ok(t) => t,
        Err(e) => return trouble(e),
    };
    let rows = t
        .leaderboard
        .iter()
        .map(|r| RowOut {
            rank: r.rank,
            id: r.submission.clone(),
            solver: r.solver.clone(),
            model: r.model.clone().unwrap_or_else(|| "–".into()),
            score: f4(r.score),
            rank_score: format!("{}", r.rank_score),
            capped: (r.rank_score < r.score).then(|| f4(r.rank_score)),
            ci: ci(r.ci95),
            gain: pct(r.gain),
            gap: r.gap_to_above.map(f4).unwrap_or_else(|| "–".into()),
            status: r.status.clone(),
            date: datetime(r.created_ms),
        })
        .collect();
    let ledger = match record::ledger(&s.db, &name).await {
        Ok(l) => l,
        Err(e) => return trouble(e),
    };
    let ledger_svg = (!ledger.is_empty()).then(|| plots::ledger(&ledger, None));
    let ledger = ledger
        .iter()
        .map(|r| LedgerOut {
            id: r.submission.clone(),
            solver: r.solver.clone(),
            machine: r.local.machine_line(),
            local: score_ci(r.local.score, Some(r.local.ci95)),
            ranked: score_ci(r.ranked_score, r.ranked_ci95),
            transfer: pct(Some(r.ranked_score / r.local.score - 1.0)),
            status: r.status.clone(),
        })
        .collect();
    let failures = record::Filter {
        track: Some(name.clone()),
        solver: None,
        status: Some("failed".into()),
        page: 1,
        per_page: FAILED_SHOWN,
        viewer: None,
    };
    let failures = match record::submissions(&s.db, &failures).await {
        Ok(f) => f,
        Err(e) => return trouble(e),
    };
    let failed = failures
        .submissions
        .iter()
        .map(|f| FailedOut {
            id: f.id.clone(),
            solver: f.solver.clone(),
            category: f.category.clone().unwrap_or_else(|| "–".into()),
            date: datetime(f.created_ms),
        })
        .collect();
    let queue = t
        .queue
        .iter()
        .map(|q| QueueOut {
            id: q.submission.clone(),
            solver: if q.private {
                "–".into()
            } else {
                q.solver.clone()
            },
            stage: q.stage.clone(),
            kind: q.kind.clone(),
            position: match (q.position, &q.runner) {
                (Some(p), _) => format!("{} (waiting)", p + 1),
                (None, Some(_)) => "running".into(),
                (None, None) => "–".into(),
            },
            runner: q.runner.clone().unwrap_or_else(|| "–".into()),
            since: datetime(q.created_ms),
        })
        .collect();
    page(
        StatusCode::OK,
        TrackPage {
            title: format!("{name}: leaderboard"),
            live: !t.queue.is_empty(),
            rules: rules(&t),
            surface: t.surface.join(", "),
            best: f4(t.current_best_score),
            base: short(&t.current_base),
            best_metrics: metrics(t.current_best_metrics.as_ref()),
            frontier_svg: plots::frontier(&t.frontier, &t.leaderboard, now_ms()),
            ledger_svg,
            ledger,
            name: t.name,
            description: t.description,
            rows,
            queue,
            failed,
            failed_total: failures.total,
        }
        .render(),
    )
}

struct StageOut {
    stage: String,
    runner: String,
    started: String,
    duration: String,
    outcome: String,
    class: &'static str,
    detail: String,
}

fn stage_out(st: &StageView) -> StageOut {
    let outcome = st.outcome.clone().unwrap_or_else(|| "running".into());
    let class = match outcome.as_str() {
        "ok" | "held" | "promoted" | "queued" | "tested" | "benchmarked" | "profiled" => "ok",
        "running" => "running",
        "skipped" => "muted",
        _ => "bad",
    };
    StageOut {
        stage: st.stage.clone(),
        runner: st.runner.clone().unwrap_or_else(|| "service".into()),
        // The day is the submission's (in its header); a stage's start needs the time.
        started: datetime_seconds(st.started_ms)[11..19].to_string(),
        duration: match st.ended_ms {
            Some(e) => format!("{:.1} s", (e - st.started_ms) as f64 / 1000.0),
            None => format!("{:.0} s so far", (now_ms() - st.started_ms) as f64 / 1000.0),
        },
        outcome,
        class,
        detail: st.detail.clone().unwrap_or_default(),
    }
}

struct PricingOut {
    id: String,
    base: String,
    status: String,
    score: String,
    ci: String,
    date: String,
    this: bool,
}

#[derive(Template)]
#[template(path = "submission.html")]
struct SubmissionPage {
    title: String,
    live: bool,
    id: String,
    solver: String,
    track: String,
    model: String,
    claimed: String,
    base: String,
    created: String,
    status: String,
    /// The mode of a private run (`test`, `benchmark`, `profile`), which only its solver sees.
    private: Option<String>,
    /// A profile run's profile (its solver's only, as the page is), drawn here.
    profile: Option<ProfileOut>,
    cheat: Option<String>,
    note_html: String,
    queue_position: Option<String>,
    stages: Vec<StageOut>,
    outcome: String,
    failure: Option<(String, String, String)>,
    metrics: Vec<MetricRow>,
    confirmation: Vec<MetricRow>,
    pairs_svg: Option<String>,
    confirmation_pairs_svg: Option<String>,
    /// The solver's local result in one line, and the ledger's plot with this run's point
    /// against the track's public ones (once the arena priced it).
    local: Option<String>,
    ledger_svg: Option<String>,
    pricings: Vec<PricingOut>,
    code: Option<String>,
    code_policy: String,
}

/// A submission's point in its track's ledger: the track's public rows with its own (a private
/// run's, or one not yet in them) added, when it has a local result and the arena's score.
fn ledger_with(v: &SubmissionView, mut rows: Vec<LedgerRow>) -> Option<String> {
    let local = v.local_result.clone()?;
    let verdict = v.verdict.as_ref()?;
    let ranked_score = verdict["score"].as_f64()?;
    if !rows.iter().any(|r| r.submission == v.id) {
        rows.push(LedgerRow {
            submission: v.id.clone(),
            solver: v.solver.clone(),
            track: v.track.clone(),
            mode: v.mode,
            local,
            ranked_score,
            ranked_ci95: serde_json::from_value(verdict["ci95"].clone()).ok(),
            status: v.status.clone(),
            created_ms: v.created_ms,
        });
    }
    Some(plots::ledger(&rows, Some(&v.id)))
}

/// A profile as the page shows it: its note, and SVGs the service drew from its numbers.
struct ProfileOut {
    note: String,
    decode_svg: String,
    prefill_svg: String,
    timeline_svg: Option<String>,
}

fn profile_out(p: &crate::profile::Profile) -> ProfileOut {
    ProfileOut {
        note: p.note.clone(),
        decode_svg: plots::profile_ops("Time per op of a decode step", "ms/token", &p.decode),
        prefill_svg: plots::profile_ops(
            &format!("Time per op of the prefill of {} tokens", p.prompt_tokens),
            "ms/prefill",
            &p.prefill,
        ),
        timeline_svg: p.timeline.as_ref().map(plots::waterfall),
    }
}

fn submission_page(
    v: SubmissionView,
    note_html: String,
    floor: f64,
    publish: &str,
    ledger: Vec<LedgerRow>,
) -> SubmissionPage {
    let verdict = v.verdict.as_ref();
    let failure = verdict.filter(|x| x["status"] == "failed").map(|x| {
        (
            x["category"].as_str().unwrap_or("").to_string(),
            x["stage"].as_str().unwrap_or("").to_string(),
            x["detail"].as_str().unwrap_or("").to_string(),
        )
    });
    let outcome = v
        .stages
        .iter()
        .rev()
        .find(|s| s.stage == "verdict")
        .and_then(|s| s.detail.clone())
        .unwrap_or_default();
    // Each pricing its own plot, with its own score and interval.
    let plot =
        |title: &str, pairs: &[crate::api::PairPoint], figures: Option<&serde_json::Value>| {
            let score = figures.and_then(|x| x["score"].as_f64());
            let ci95 = figures.and_then(|x| serde_json::from_value(x["ci95"].clone()).ok());
            (!pairs.is_empty()).then(|| plots::pairs(title, pairs, score, ci95, floor))
        };
    let pairs_svg = plot("Pairs of the pricing", &v.pairs, verdict);
    let confirmation_pairs_svg = plot(
        "Pairs of the confirmation pricing",
        &v.confirmation_pairs,
        verdict.map(|x| &x["confirmation"]),
    );
    let ledger_svg = ledger_with(&v, ledger);
    SubmissionPage {
        local: v.local_result.as_ref().map(local_line),
        ledger_svg,
        title: format!("submission {}", v.id),
        live: !v.finished(),
        solver: v.solver.clone(),
        track: v.track.clone(),
        model: v.model.clone().unwrap_or_else(|| "–".into()),
        claimed: v.claimed_score.map(f4).unwrap_or_else(|| "–".into()),
        base: short(&v.base_commit),
        created: datetime(v.created_ms),
        status: v.status.clone(),
        private: v.mode.private().then(|| v.mode.to_string()),
        profile: v.profile.as_ref().map(profile_out),
        cheat: v.cheat.clone(),
        note_html,
        queue_position: v
            .queue_position
            .map(|p| format!("{p} ahead of it in the queue for its next stage")),
        stages: v.stages.iter().map(stage_out).collect(),
        outcome,
        failure,
        metrics: metrics(verdict.map(|x| &x["metrics"])),
        confirmation: metrics(verdict.map(|x| &x["confirmation"])),
        pairs_svg,
        confirmation_pairs_svg,
        pricings: v
            .pricings
            .iter()
            .map(|p| PricingOut {
                this: p.submission == v.id,
                id: p.submission.clone(),
                base: short(&p.base_commit),
                status: p.status.clone(),
                score: p.score.map(f4).unwrap_or_else(|| "–".into()),
                ci: ci(p.ci95),
                date: datetime(p.created_ms),
            })
            .collect(),
        code: v.code.clone(),
        code_policy: match publish {
            "always" => "This track publishes every submission's code.".into(),
            "after_promotion" => {
                "This track publishes a submission's code once it is promoted.".into()
            }
            _ => "This track does not publish code.".into(),
        },
        id: v.id,
    }
}

/// A private run's page is its solver's only (a request with its token, as the API's); anyone
/// else gets the page of an unknown id.
pub async fn submission(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let viewer = match super::viewer(&s, &headers).await {
        Ok(v) => v,
        Err(e) => return error_page(e.0, e.1),
    };
    let v = match record::submission_view(&s, &id).await {
        Ok(Some(v)) if super::may_see(viewer.as_deref(), &v.solver, v.mode) => v,
        Ok(_) => return not_found(format!("There is no submission {id}.")),
        Err(e) => return trouble(e),
    };
    // Rendered at intake (or once, on a first view, for a note stored before that).
    let note = match notes::html(&s.db, &id).await {
        Ok(h) => h.unwrap_or_default(),
        Err(e) => return trouble(e),
    };
    let (floor, publish) = s
        .tracks
        .get(&v.track)
        .map(|t| (t.clock.floor, t.publish_code.clone()))
        .unwrap_or((0.0, "never".into()));
    // Only read when it has a local result to plot against the track's.
    let ledger = if v.local_result.is_some() {
        match record::ledger(&s.db, &v.track).await {
            Ok(l) => l,
            Err(e) => return trouble(e),
        }
    } else {
        vec![]
    };
    page(
        StatusCode::OK,
        submission_page(v, note, floor, &publish, ledger).render(),
    )
}

/// A track's part of a solver's ledger: its plot.
struct TrackLedgerOut {
    track: String,
    svg: String,
}

/// A local machine's transfer on one track, as the solver's page shows it.
struct MachineOut {
    track: String,
    machine: String,
    rows: u64,
    /// The ratios ranked over local: their geometric mean and range, each minus one.
    mean: String,
    range: String,
    within: String,
}

/// One of the solver's submissions: the arena's score beside its local one.
struct SolverRowOut {
    id: String,
    track: String,
    /// A private run's mode (only the solver itself is shown one).
    private: Option<String>,
    status: String,
    ranked: String,
    local: String,
    machine: String,
    date: String,
}

/// The most submissions a solver's page lists (the API pages through all of them).
const SOLVER_SHOWN: u64 = 50;

#[derive(Template)]
#[template(path = "solver.html")]
struct SolverPage {
    title: String,
    live: bool,
    name: String,
    /// Whether the reader is the solver itself (its token): its private runs are shown.
    own: bool,
    ledgers: Vec<TrackLedgerOut>,
    machines: Vec<MachineOut>,
    rows: Vec<SolverRowOut>,
    total: i64,
}

/// A solver's page: its ledger plotted per track (local against ranked, the intervals, y = x),
/// how far each of its local machines sat from the arena, and its newest submissions with both
/// scores. Its private runs are on it only for itself (a request with its token, as the API's);
/// a solver with no leaderboard submission is, to anyone else, a name nobody holds.
pub async fn solver(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    let own = match super::viewer(&s, &headers).await {
        Ok(v) => v.as_deref() == Some(name.as_str()),
        Err(e) => return error_page(e.0, e.1),
    };
    match record::solver_is_public(&s.db, &name).await {
        Ok(true) => {}
        Ok(false) if own => {}
        Ok(false) => return not_found(format!("There is no solver {name}.")),
        Err(e) => return trouble(e),
    }
    let ledger = match record::solver_ledger(&s.db, &name, own).await {
        Ok(l) => l,
        Err(e) => return trouble(e),
    };
    let mut tracks: Vec<&str> = ledger.iter().map(|r| r.track.as_str()).collect();
    tracks.sort_unstable();
    tracks.dedup();
    let ledgers = tracks
        .into_iter()
        .map(|t| {
            let rows: Vec<LedgerRow> = ledger.iter().filter(|r| r.track == t).cloned().collect();
            TrackLedgerOut {
                track: t.to_string(),
                svg: plots::ledger(&rows, None),
            }
        })
        .collect();
    let machines = record::machines(&ledger)
        .into_iter()
        .map(|m| MachineOut {
            mean: pct(Some(m.ratio_mean - 1.0)),
            range: format!(
                "{} to {}",
                pct(Some(m.ratio_min - 1.0)),
                pct(Some(m.ratio_max - 1.0))
            ),
            within: format!("{} of {}", m.within_local_ci, m.rows),
            track: m.track,
            machine: m.machine,
            rows: m.rows,
        })
        .collect();
    let list = record::Filter {
        track: None,
        solver: Some(name.clone()),
        status: None,
        page: 1,
        per_page: SOLVER_SHOWN,
        viewer: own.then(|| name.clone()),
    };
    let list = match record::submissions(&s.db, &list).await {
        Ok(l) => l,
        Err(e) => return trouble(e),
    };
    let rows = list
        .submissions
        .iter()
        .map(|r| SolverRowOut {
            id: r.id.clone(),
            track: r.track.clone(),
            private: r.mode.private().then(|| r.mode.to_string()),
            status: r.status.clone(),
            ranked: r.score.map(f4).unwrap_or_else(|| "–".into()),
            local: r
                .local_result
                .as_ref()
                .map(|l| score_ci(l.score, Some(l.ci95)))
                .unwrap_or_else(|| "–".into()),
            machine: r
                .local_result
                .as_ref()
                .map(LocalResult::machine_line)
                .unwrap_or_default(),
            date: datetime(r.created_ms),
        })
        .collect();
    page(
        StatusCode::OK,
        SolverPage {
            title: format!("solver {name}"),
            live: false,
            own,
            ledgers,
            machines,
            rows,
            total: list.total,
            name,
        }
        .render(),
    )
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage {
    title: String,
    live: bool,
    what: String,
}

pub async fn live_js() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/javascript; charset=utf-8"),
        )],
        LIVE_JS,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_rows_in_the_documented_order_each_explained() {
        let v = serde_json::json!({"zz_older": 1, "ci95": [0.9, 1.1], "score": 1.0});
        let rows = metrics(Some(&v));
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["score", "ci95", "zz_older"]);
        assert!(rows[0].meaning.contains("speed-up") && rows[1].meaning.contains("interval"));
        assert_eq!(rows[2].meaning, "", "an unknown key has no meaning to show");
        assert!(rows.iter().all(|r| r.numeric));
        let words = metrics(Some(&serde_json::json!({"ci_method": "jackknife"})));
        assert!(!words[0].numeric);
    }
}
