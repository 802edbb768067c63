//! The service (`fastdecode arena serve`): axum routes over the database, the tracks, the
//! stores and the arena's repository. It holds no GPU and runs no candidate code; everything it
//! knows is in the database and its stores, so it can be restarted at any moment.
//!
//! Public: the pages (`/`, `/tracks/{name}`, `/submissions/{id}`, `/solvers/{name}`: `pages`)
//! and their JSON (`GET /api/tracks`, `/api/tracks/{name}`, `/api/tracks/{name}/ledger`,
//! `/api/solvers/{name}/ledger`, `/api/submissions`, `/api/submissions/{id}`: `docs/api.md`),
//! both from the queries of `record`, a solver's private runs in them to that solver only; a
//! profile run's `/api/submissions/{id}/profile` (and `profile.svg`, `timeline.svg`) to its
//! solver only.
//! Solvers: `POST /api/submissions`. Runners: `POST /api/runner/{lease,heartbeat,report}`,
//! `GET /api/trees/{commit}`, `GET|PUT /api/artifacts/{digest}`, `GET /api/builds/{key}`,
//! `GET /api/hidden/{digest}`.
//!
//! This folder is the service's HTTP face: these routes (the JSON API), the public pages
//! (`pages`, HTML) and the record's plots on them (`plots`, SVG).

pub mod pages;
pub mod plots;

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use sqlx::Row;

use crate::api::{
    Accepted, BuildRecord, Heartbeat, Job, LeaseRequest, Ledger, Mode, NewSubmission, Report,
    ReportReply, SolverLedger, SubmissionList, SubmissionView, TrackView,
};
use crate::bundle;
use crate::record::{self, notes, verdict};
use crate::service::db::{new_id, now_ms};
use crate::service::{
    caps, current_base, lease, stages, tokens, ApiError, ApiResult, AppState, Service,
};
use crate::track::Track;

fn bearer(h: &HeaderMap) -> ApiResult<(String, String)> {
    let v = h
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "no bearer token"))?;
    let (id, secret) = tokens::split(v.trim())
        .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "a malformed token"))?;
    Ok((id.to_string(), secret.to_string()))
}

fn unauthorized() -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "unknown token")
}

/// The id of a request's token and its holder's row, selected by `query` (`... secret_hash ...
/// WHERE id = $1`), once the token's secret matches the row's hash; an unknown id or a wrong
/// secret is the same `unknown token`.
async fn holder(
    s: &Service,
    h: &HeaderMap,
    query: &'static str,
) -> ApiResult<(String, sqlx::any::AnyRow)> {
    let (id, secret) = bearer(h)?;
    let row = sqlx::query(query)
        .bind(&id)
        .fetch_optional(&s.db.pool)
        .await?
        .ok_or_else(unauthorized)?;
    let stored: String = row.try_get("secret_hash")?;
    if !tokens::matches(&secret, &stored) {
        return Err(unauthorized());
    }
    Ok((id, row))
}

/// The solver a request's token belongs to.
async fn solver(s: &Service, h: &HeaderMap) -> ApiResult<String> {
    let (id, _) = holder(s, h, "SELECT secret_hash FROM solvers WHERE id = $1").await?;
    Ok(id)
}

/// Who reads a submission or a list: the solver whose token the request carries, or `None`
/// without one (the public). A token that is not a solver's is refused, not read as no token.
pub(crate) async fn viewer(s: &Service, h: &HeaderMap) -> ApiResult<Option<String>> {
    if h.get("authorization").is_none() {
        return Ok(None);
    }
    solver(s, h).await.map(Some)
}

/// Whether `viewer` may see a submission of `solver` in `mode`: a private run (`test`,
/// `benchmark`, `profile`) only by its own solver. Others are answered as if it did not exist
/// (404, not 403), so that its existence does not leak.
pub(crate) fn may_see(viewer: Option<&str>, solver: &str, mode: Mode) -> bool {
    !mode.private() || viewer == Some(solver)
}

/// The runner a request's token belongs to, and its kind.
async fn runner(s: &Service, h: &HeaderMap) -> ApiResult<(String, String)> {
    let (id, row) = holder(s, h, "SELECT secret_hash, kind FROM runners WHERE id = $1").await?;
    sqlx::query("UPDATE runners SET last_seen_ms = $1 WHERE id = $2")
        .bind(now_ms())
        .bind(&id)
        .execute(&s.db.pool)
        .await?;
    Ok((id, row.try_get("kind")?))
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(pages::index))
        .route("/tracks/{name}", get(pages::track))
        .route("/submissions/{id}", get(pages::submission))
        .route("/solvers/{name}", get(pages::solver))
        .route("/static/live.js", get(pages::live_js))
        .route("/api/tracks", get(list_tracks))
        .route("/api/tracks/{name}", get(one_track))
        .route("/api/tracks/{name}/ledger", get(track_ledger))
        .route("/api/solvers/{name}/ledger", get(solver_ledger))
        .route(
            "/api/submissions",
            post(intake).layer(DefaultBodyLimit::max(16 << 20)),
        )
        .route("/api/submissions", get(list_submissions))
        .route("/api/submissions/{id}", get(one_submission))
        .route("/api/submissions/{id}/profile", get(one_profile))
        .route("/api/submissions/{id}/profile.svg", get(profile_svg))
        .route("/api/submissions/{id}/timeline.svg", get(timeline_svg))
        .route("/api/runner/lease", post(take_lease))
        .route("/api/runner/heartbeat", post(heartbeat))
        .route("/api/runner/report", post(report))
        .route("/api/trees/{commit}", get(tree))
        .route(
            "/api/artifacts/{digest}",
            get(get_artifact)
                .put(put_artifact)
                .layer(DefaultBodyLimit::max(1 << 30)),
        )
        .route("/api/builds/{key}", get(get_build))
        .route("/api/hidden/{digest}", get(get_hidden))
        .fallback(nowhere)
        .with_state(state)
        .layer(middleware::from_fn(json_errors))
}

/// Every error under /api/ in the one shape `docs/api.md` promises, `{"error": …}`, with the
/// text it had: axum's own rejections (405 with no body; 400, 413, 415 in plain text) never
/// reach a handler's `ApiError`.
async fn json_errors(req: Request, next: Next) -> Response {
    let api = req.uri().path().starts_with("/api/");
    let r = next.run(req).await;
    let is_json = r
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    let status = r.status();
    if !api || is_json || !(status.is_client_error() || status.is_server_error()) {
        return r;
    }
    let (parts, body) = r.into_parts();
    let text = axum::body::to_bytes(body, 64 << 10)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let msg = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_lowercase()
    } else {
        text
    };
    let mut out = ApiError::new(status, msg).into_response();
    // What the rejection says beside its body stays (405's Allow, 429's Retry-After).
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            out.headers_mut().insert(name, value.clone());
        }
    }
    out
}

/// Only a CPU runner builds (policy, review, build): a runner of another kind that asks for
/// build jobs is refused, whatever it says of itself.
fn may_build(runner: &str, kind: &str, asks: bool) -> ApiResult<()> {
    if asks && kind != "cpu" {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("runner {runner} is a {kind} runner: only a cpu runner takes build jobs"),
        ));
    }
    Ok(())
}

/// The most a runner's lease, heartbeat or report request may hold (axum's default limit).
const RUNNER_BODY_BYTES: usize = 2 << 20;

/// A runner's request body, read only after its token was accepted (a caller without one learns
/// nothing of the schema, and sends no megabytes to be read) and bounded.
async fn runner_body<T: serde::de::DeserializeOwned>(body: Body) -> ApiResult<T> {
    let bytes = axum::body::to_bytes(body, RUNNER_BODY_BYTES)
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body: not read within {RUNNER_BODY_BYTES} bytes ({e})"),
            )
        })?;
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("the request body: {e}"),
        )
    })
}

/// A path that names nothing: a JSON error under /api/, else a page.
async fn nowhere(uri: Uri) -> Response {
    if uri.path().starts_with("/api/") {
        ApiError::new(StatusCode::NOT_FOUND, format!("no route {}", uri.path())).into_response()
    } else {
        pages::not_found(format!("There is nothing at {}.", uri.path()))
    }
}

async fn list_tracks(State(s): State<AppState>) -> ApiResult<Json<Vec<TrackView>>> {
    let mut out = vec![];
    for name in s.tracks.keys() {
        out.push(record::track_view(&s, name).await?);
    }
    Ok(Json(out))
}

async fn one_track(
    State(s): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<TrackView>> {
    if !s.tracks.contains_key(&name) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no track {name}"),
        ));
    }
    Ok(Json(record::track_view(&s, &name).await?))
}

/// The track's transfer ledger: public submissions' local pricings beside the arena's.
async fn track_ledger(
    State(s): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<Ledger>> {
    if !s.tracks.contains_key(&name) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no track {name}"),
        ));
    }
    Ok(Json(Ledger {
        rows: record::ledger(&s.db, &name).await?,
        track: name,
    }))
}

/// A solver's transfer ledger over every track, with its machines' summary: its leaderboard
/// submissions to anyone, its priced private runs too to itself (its token).
async fn solver_ledger(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> ApiResult<Json<SolverLedger>> {
    let own = viewer(&s, &headers).await?.as_deref() == Some(name.as_str());
    if !own && !record::solver_is_public(&s.db, &name).await? {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no solver {name}"),
        ));
    }
    let rows = record::solver_ledger(&s.db, &name, own).await?;
    Ok(Json(SolverLedger {
        machines: record::machines(&rows),
        rows,
        solver: name,
    }))
}

/// `?track=&solver=&status=&page=&per_page=`; any other parameter is refused by name.
/// With a solver's token the list holds that solver's own private runs too; without one, or
/// another solver's, only leaderboard submissions.
async fn list_submissions(
    State(s): State<AppState>,
    headers: HeaderMap,
    Query(mut q): Query<BTreeMap<String, String>>,
) -> ApiResult<Json<SubmissionList>> {
    let viewer = viewer(&s, &headers).await?;
    let bad = |m: String| ApiError::new(StatusCode::BAD_REQUEST, m);
    let mut take = |k: &str| q.remove(k);
    let f = record::Filter::parse(
        take("track"),
        take("solver"),
        take("status"),
        take("page"),
        take("per_page"),
    )
    .map_err(|e| bad(format!("{e:#}")))?
    .seen_by(viewer);
    if let Some(k) = q.keys().next() {
        return Err(bad(format!(
            "{k}: not a parameter (track, solver, status, page, per_page)"
        )));
    }
    if let Some(t) = &f.track {
        if !s.tracks.contains_key(t) {
            return Err(bad(format!("track={t:?}: no such track")));
        }
    }
    Ok(Json(record::submissions(&s.db, &f).await?))
}

async fn existing<'c>(
    db: impl sqlx::Executor<'c, Database = sqlx::Any>,
    solver: &str,
    key: &str,
) -> Result<Option<String>> {
    Ok(
        sqlx::query("SELECT id FROM submissions WHERE solver = $1 AND idempotency_key = $2")
            .bind(solver)
            .bind(key)
            .fetch_optional(db)
            .await?
            .map(|r| r.try_get("id"))
            .transpose()?,
    )
}

/// The 429 of a solver whose cap on `track` is full.
fn capped(track: &Track, u: &caps::Usage) -> ApiError {
    let cap = i64::from(track.caps.failures_per_day);
    let retry = u.retry_after(cap, now_ms());
    let when = match retry {
        Some(s) => format!("retry in {s} s"),
        None => "retry when one of your queued or running submissions has finished".into(),
    };
    ApiError(
        StatusCode::TOO_MANY_REQUESTS,
        format!(
            "{} count against your daily cap of {cap} on track {}: {}; {when}",
            u.counted(),
            track.name,
            u.describe()
        ),
        Some(retry.unwrap_or(caps::IN_FLIGHT_RETRY_S)),
    )
}

/// The 429 of a solver whose private runs on `track` fill its quota (or a track taking none).
fn over_quota(track: &Track, runs: &caps::PrivateRuns) -> ApiError {
    let quota = i64::from(track.caps.private_runs_per_day);
    if quota == 0 {
        return ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "track {} takes no private runs (caps.private_runs_per_day is 0): submit with \
                 --mode leaderboard",
                track.name
            ),
        );
    }
    let retry = runs
        .retry_after(quota, now_ms())
        .unwrap_or(caps::IN_FLIGHT_RETRY_S);
    ApiError(
        StatusCode::TOO_MANY_REQUESTS,
        format!(
            "{} private run(s) (test, benchmark or profile) in the last day fill your daily quota of \
             {quota} on track {} (caps.private_runs_per_day); retry in {retry} s, or submit \
             with --mode leaderboard, which this quota does not count",
            runs.created.len(),
            track.name
        ),
        Some(retry),
    )
}

/// Refuses a submission in `mode` beyond what `solver` may start on `track`: a private run
/// past its daily quota (`caps.private_runs_per_day`), a leaderboard submission past the
/// failure cap (`caps`). Neither counts the other's.
async fn within_cap(
    conn: &mut sqlx::AnyConnection,
    solver: &str,
    track: &Track,
    mode: Mode,
) -> ApiResult<()> {
    if mode.private() {
        let runs = caps::private_runs(conn, solver, track, now_ms()).await?;
        if runs.created.len() as i64 >= i64::from(track.caps.private_runs_per_day) {
            return Err(over_quota(track, &runs));
        }
        return Ok(());
    }
    let u = caps::usage(conn, solver, track, now_ms()).await?;
    if u.counted() >= i64::from(track.caps.failures_per_day) {
        return Err(capped(track, &u));
    }
    Ok(())
}

/// The request's fields other than the bundle and the note's Markdown, checked.
fn check_fields(req: &NewSubmission, track: &Track) -> std::result::Result<(), String> {
    if let Some(l) = &req.local_result {
        l.check(&track.clock_track)
            .map_err(|e| format!("local_result.{e}"))?;
    }
    if req.note.trim().is_empty() || req.note.len() > notes::MAX_BYTES {
        return Err("note: 1 byte to 64 KiB of Markdown".into());
    }
    if req.model.as_ref().is_some_and(|m| m.len() > 200) {
        return Err("model: at most 200 characters".into());
    }
    if req.claimed_score.is_some_and(|c| !c.is_finite()) {
        return Err("claimed_score: a finite number".into());
    }
    Ok(())
}

pub(crate) async fn intake(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let solver = solver(&s, &headers).await?;
    let bad = |m: String| ApiError::new(StatusCode::BAD_REQUEST, m);
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|k| !k.is_empty() && k.len() <= 128)
        .ok_or_else(|| bad("the Idempotency-Key header (1 to 128 characters) is required".into()))?
        .to_string();
    if let Some(id) = existing(&s.db.pool, &solver, &key).await? {
        return Ok(accepted(id, true));
    }
    let req: NewSubmission =
        serde_json::from_slice(&body).map_err(|e| bad(format!("the request body: {e}")))?;
    let track = s
        .tracks
        .get(&req.track)
        .ok_or_else(|| bad(format!("track {:?}: no such track", req.track)))?;
    check_fields(&req, track).map_err(bad)?;
    // Before any work on the body; counted again where the submission is added.
    within_cap(&mut *s.db.pool.acquire().await?, &solver, track, req.mode).await?;
    // Bounded, and rendered once, here, off the executor (`notes`).
    let note_html = notes::render_off_executor(req.note.clone())
        .await?
        .map_err(bad)?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(req.bundle.as_bytes())
        .map_err(|e| bad(format!("bundle: not base64 ({e})")))?;
    // Only whether it is a readable gzip tar within the caps is decided here; what is in it is
    // the policy stage's to judge (and to record).
    bundle::read(&bytes, track.caps.total_bytes).map_err(|e| bad(format!("bundle: {e:#}")))?;
    let digest = s.store.put_artifact(&bytes)?;
    let new = Intake {
        solver: &solver,
        key: &key,
        req: &req,
        note_html: &note_html,
        digest: &digest,
    };
    add(&s, track, &new).await
}

/// A checked submission, ready to be added.
struct Intake<'a> {
    solver: &'a str,
    key: &'a str,
    req: &'a NewSubmission,
    note_html: &'a str,
    digest: &'a str,
}

/// Adds `n` to the queue, its cap counted in the same transaction (the solver's submissions
/// take turns there, so that many at once cannot all pass one count).
async fn add(s: &Service, track: &Track, n: &Intake<'_>) -> ApiResult<Response> {
    let (base, _, _) = current_base(&s.db, &track.name).await?;
    let mut tx = s.db.write().await?;
    caps::lock_solver(&mut tx, s.db.backend, n.solver).await?;
    if let Some(id) = existing(&mut *tx, n.solver, n.key).await? {
        return Ok(accepted(id, true));
    }
    within_cap(&mut tx, n.solver, track, n.req.mode).await?;
    let id = new_id("s");
    let inserted = sqlx::query(
        "INSERT INTO submissions (id, solver, track, idempotency_key, model, claimed_score, \
         note, note_html, bundle_digest, base_commit, created_ms, status, next_stage, next_kind, \
         mode, local_result) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, 'queued', $12, \
         $13, $14, $15)",
    )
    .bind(&id)
    .bind(n.solver)
    .bind(&track.name)
    .bind(n.key)
    .bind(&n.req.model)
    .bind(n.req.claimed_score)
    .bind(&n.req.note)
    .bind(n.note_html)
    .bind(n.digest)
    .bind(&base)
    .bind(now_ms())
    .bind(stages::POLICY)
    .bind(stages::kind(stages::POLICY, track))
    .bind(n.req.mode.as_str())
    // As checked, written again from its fields: nothing else the request carried.
    .bind(
        n.req
            .local_result
            .as_ref()
            .map(serde_json::to_string)
            .transpose()
            .map_err(anyhow::Error::from)?,
    )
    .execute(&mut *tx)
    .await;
    if let Err(e) = inserted {
        drop(tx);
        // Two requests with one key at once: the other one's insert won.
        if let Some(id) = existing(&s.db.pool, n.solver, n.key).await? {
            return Ok(accepted(id, true));
        }
        return Err(e.into());
    }
    tx.commit().await?;
    Ok(accepted(id, false))
}

/// The answer to a submission: 201 for a new one; 200 for an idempotency key already used,
/// naming the earlier submission, so a solver retrying after a lost answer learns its id.
fn accepted(id: String, duplicate: bool) -> Response {
    let status = if duplicate {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    (status, Json(Accepted { id, duplicate })).into_response()
}

async fn one_submission(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Json<SubmissionView>> {
    let viewer = viewer(&s, &headers).await?;
    record::submission_view(&s, &id)
        .await?
        .filter(|v| may_see(viewer.as_deref(), &v.solver, v.mode))
        .map(Json)
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("no submission {id}")))
}

/// A profile run's profile, as its view is shown: to its solver only (anyone else gets the
/// unknown id's 404), and a 404 saying why for another mode or before its profile stage.
async fn visible_profile(
    s: &Service,
    headers: &HeaderMap,
    id: &str,
) -> ApiResult<crate::profile::Profile> {
    let viewer = viewer(s, headers).await?;
    let row = sqlx::query("SELECT solver, mode FROM submissions WHERE id = $1")
        .bind(id)
        .fetch_optional(&s.db.pool)
        .await?;
    let not_found = |m: String| ApiError::new(StatusCode::NOT_FOUND, m);
    let mode = match row {
        Some(r) => {
            let solver: String = r.try_get("solver")?;
            let mode = record::mode_of(&r)?;
            if !may_see(viewer.as_deref(), &solver, mode) {
                return Err(not_found(format!("no submission {id}")));
            }
            mode
        }
        None => return Err(not_found(format!("no submission {id}"))),
    };
    if mode != Mode::Profile {
        return Err(not_found(format!(
            "submission {id} is a {mode} run: only a profile run has a profile"
        )));
    }
    record::profile(&s.db, id)
        .await?
        .ok_or_else(|| not_found(format!("submission {id} has no profile yet")))
}

async fn one_profile(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Json<crate::profile::Profile>> {
    Ok(Json(visible_profile(&s, &headers, &id).await?))
}

/// An SVG the service drew (from the profile's numbers), as an image that runs nothing.
fn svg(text: String) -> Response {
    (
        [
            (header::CONTENT_TYPE, "image/svg+xml"),
            (header::CONTENT_SECURITY_POLICY, "default-src 'none'"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        text,
    )
        .into_response()
}

/// The per-op bars of a profile's decode step.
async fn profile_svg(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let p = visible_profile(&s, &headers, &id).await?;
    Ok(svg(plots::profile_ops(
        "Time per op of a decode step",
        "ms/token",
        &p.decode,
    )))
}

/// The kernel waterfall of a profile's timeline (CUDA tracks); a 404 saying why when none.
async fn timeline_svg(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let p = visible_profile(&s, &headers, &id).await?;
    match &p.timeline {
        Some(t) => Ok(svg(plots::waterfall(t))),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("submission {id} has no kernel timeline: {}", p.note),
        )),
    }
}

/// The job a runner receives for `submission` at `stage`.
async fn job(s: &Service, submission: &str, lease_id: &str, stage: &str) -> ApiResult<Job> {
    let r = sqlx::query("SELECT track, base_commit, bundle_digest FROM submissions WHERE id = $1")
        .bind(submission)
        .fetch_one(&s.db.pool)
        .await?;
    let track: String = r.try_get("track")?;
    let track = s
        .tracks
        .get(&track)
        .with_context(|| format!("submission {submission}: track {track} is no longer loaded"))?;
    Ok(Job {
        submission: submission.to_string(),
        lease_id: lease_id.to_string(),
        lease_seconds: (s.lease_ms / 1000) as u64,
        stage: stage.to_string(),
        track: track.clone(),
        base_commit: r.try_get("base_commit")?,
        bundle_digest: r.try_get("bundle_digest")?,
        results: stages::results(&s.db, submission).await?,
    })
}

async fn take_lease(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let (runner, kind) = runner(&s, &headers).await?;
    let req: LeaseRequest = runner_body(body).await?;
    may_build(&runner, &kind, req.builder)?;
    match lease::take(&s.db, &runner, &kind, req.builder, s.lease_ms).await? {
        Some(l) => Ok(Json(job(&s, &l.submission, &l.lease_id, &l.stage).await?).into_response()),
        None => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}

async fn heartbeat(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<StatusCode> {
    runner(&s, &headers).await?;
    let h: Heartbeat = runner_body(body).await?;
    let progress = h.progress.as_deref();
    if lease::heartbeat(&s.db, &h.submission, &h.lease_id, s.lease_ms, progress).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::new(StatusCode::CONFLICT, "the lease is lost"))
    }
}

async fn report(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<ReportReply>> {
    let (runner, kind) = runner(&s, &headers).await?;
    let rep: Report = runner_body(body).await?;
    may_build(&runner, &kind, rep.builder)?;
    let next = verdict::on_report(&s, &runner, &kind, &rep).await?;
    let next = match next {
        Some((lease_id, stage)) => Some(job(&s, &rep.submission, &lease_id, &stage).await?),
        None => None,
    };
    Ok(Json(ReportReply { next }))
}

/// Only the commits that are, or were, a track's base are served.
async fn known_base(s: &Service, commit: &str) -> ApiResult<()> {
    let n: i64 = sqlx::query("SELECT COUNT(*) AS n FROM promotions WHERE base_commit = $1")
        .bind(commit)
        .fetch_one(&s.db.pool)
        .await?
        .try_get("n")?;
    if n == 0 {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("{commit}: not a base"),
        ));
    }
    Ok(())
}

async fn tree(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(commit): Path<String>,
) -> ApiResult<Vec<u8>> {
    runner(&s, &headers).await?;
    known_base(&s, &commit).await?;
    let repo = s.repo.clone();
    Ok(
        tokio::task::spawn_blocking(move || crate::git::archive(&repo, &commit))
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))??,
    )
}

async fn get_artifact(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(d): Path<String>,
) -> ApiResult<Vec<u8>> {
    runner(&s, &headers).await?;
    s.store
        .artifact(&d)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("{e:#}")))?
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("no artifact {d}")))
}

async fn put_artifact(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(d): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    runner(&s, &headers).await?;
    let got = bundle::digest(&body);
    if got != d {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the body's digest is {got}, not {d}"),
        ));
    }
    s.store.put_artifact(&body)?;
    Ok(StatusCode::NO_CONTENT)
}

async fn get_build(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(key): Path<String>,
) -> ApiResult<Response> {
    runner(&s, &headers).await?;
    let r = sqlx::query("SELECT artifact FROM builds WHERE build_key = $1")
        .bind(&key)
        .fetch_optional(&s.db.pool)
        .await?;
    match r {
        Some(r) => Ok(Json(BuildRecord {
            build_key: key,
            artifact: r.try_get("artifact")?,
        })
        .into_response()),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no build under the key {key}"),
        )),
    }
}

async fn get_hidden(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(d): Path<String>,
) -> ApiResult<Vec<u8>> {
    runner(&s, &headers).await?;
    if !s.tracks.values().any(|t| t.goldens.hidden == d) {
        return Err(ApiError::new(StatusCode::NOT_FOUND, "no track names it"));
    }
    s.store.hidden(&d)?.ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("{d}: not in the hidden store"),
        )
    })
}

/// Serves until ctrl-c / SIGTERM; `on_listen` gets the bound address.
pub async fn serve(
    service: Service,
    listen: &str,
    on_listen: impl FnOnce(std::net::SocketAddr),
) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("--listen {listen}: cannot bind"))?;
    on_listen(listener.local_addr()?);
    axum::serve(listener, router(Arc::new(service)))
        .with_graceful_shutdown(async {
            let term = async {
                if let Ok(mut s) =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                {
                    s.recv().await;
                }
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {},
                _ = term => {},
            }
        })
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_new_submission_is_created_and_a_used_key_answers_with_the_earlier_one() {
        for (duplicate, status) in [(false, StatusCode::CREATED), (true, StatusCode::OK)] {
            let r = accepted("s-1".into(), duplicate);
            assert_eq!(r.status(), status);
            let body = axum::body::to_bytes(r.into_body(), usize::MAX)
                .await
                .unwrap();
            let a: Accepted = serde_json::from_slice(&body).unwrap();
            assert_eq!((a.id.as_str(), a.duplicate), ("s-1", duplicate));
        }
    }
}
