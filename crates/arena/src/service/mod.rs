//! The service's core: what `fastdecode arena serve` holds ([`Service`]), the error every
//! operation on it answers with ([`ApiError`], an HTTP status and a one-line reason), the
//! tracks' current bases, and the loading of the tracks at start-up. The routes are `server`'s;
//! the record, verdicts and promotions act on a `Service` without knowing the routes.
//!
//! This folder is the service's core, what it keeps and how a job moves through it: `db` (the
//! database), `state` (where an arena lives and what an operator adds to it), `tokens` (bearer
//! tokens), `stages` (a submission's stages: their order, which kind of runner runs each, their
//! rows), `lease` (the lease of a job) and `caps` (what counts against a solver's daily cap).

pub mod caps;
pub mod db;
pub mod lease;
pub mod stages;
pub mod state;
#[cfg(test)]
pub(crate) mod testdb;
pub mod tokens;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use sqlx::Row;

use crate::api::ErrorBody;
use crate::service::db::{now_ms, Db};
use crate::store::Store;
use crate::track::Track;

/// What the service holds: the database, the tracks, the stores and the arena's repository.
/// The HTTP layer (`server`), the record's queries, verdicts and promotions all act on it.
pub struct Service {
    pub db: Db,
    pub tracks: BTreeMap<String, Track>,
    pub store: Store,
    pub repo: PathBuf,
    pub lease_ms: i64,
}

pub type AppState = Arc<Service>;

/// An HTTP error with a one-line reason.
pub struct ApiError(pub StatusCode, pub String, pub Option<u64>);

impl ApiError {
    pub fn new(code: StatusCode, msg: impl Into<String>) -> ApiError {
        ApiError(code, msg.into(), None)
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}"))
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("database: {e}"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.0, Json(ErrorBody { error: self.1 })).into_response();
        if let Some(s) = self.2 {
            r.headers_mut()
                .insert("retry-after", s.to_string().parse().expect("digits"));
        }
        r
    }
}

pub type ApiResult<T> = std::result::Result<T, ApiError>;

/// The track's current base commit and best score (the last promotion, or the baseline).
pub async fn current_base(db: &Db, track: &str) -> Result<(String, f64, Option<String>)> {
    let r = sqlx::query(
        "SELECT base_commit, score, submission FROM promotions WHERE track = $1 \
         ORDER BY seq DESC LIMIT 1",
    )
    .bind(track)
    .fetch_optional(&db.pool)
    .await?
    .context("a track without its baseline row")?;
    Ok((
        r.try_get("base_commit")?,
        r.try_get("score")?,
        r.try_get("submission")?,
    ))
}

/// Loads the tracks into the database (their baseline row) and checks what each needs.
pub async fn prepare(
    db: &Db,
    tracks: &BTreeMap<String, Track>,
    store: &Store,
    repo: &std::path::Path,
) -> Result<()> {
    for t in tracks.values() {
        let resolved = crate::git::resolve(repo, &t.baseline)
            .with_context(|| format!("track {}: baseline", t.name))?;
        if resolved != t.baseline {
            anyhow::bail!(
                "track {}: baseline {} resolves to {resolved}",
                t.name,
                t.baseline
            );
        }
        if store.hidden(&t.goldens.hidden)?.is_none() {
            anyhow::bail!(
                "track {}: its hidden material {} is not in the hidden store {} \
                 (make it with `fastdecode arena admin hidden new` and name it in the track file)",
                t.name,
                t.goldens.hidden,
                store.root.join("hidden").display()
            );
        }
        sqlx::query(
            "INSERT INTO promotions (track, seq, submission, base_commit, score, created_ms) \
             VALUES ($1, 0, NULL, $2, 1.0, $3) ON CONFLICT (track, seq) DO NOTHING",
        )
        .bind(&t.name)
        .bind(&t.baseline)
        .bind(now_ms())
        .execute(&db.pool)
        .await?;
    }
    Ok(())
}
