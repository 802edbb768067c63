//! Test-only: a service on a fresh database, SQLite or PostgreSQL (a new database of its own on
//! the server `tools/test.sh` starts), with the repository's tracks. Tests that exercise the
//! database run on both.

use std::path::Path;

use crate::service::db::Db;
use crate::service::Service;
use crate::store::Store;

/// Where a test's records live.
#[derive(Debug, Clone, Copy)]
pub enum On {
    Sqlite,
    /// A new database of its own on the server tools/test.sh starts.
    Postgres,
}

pub fn url(on: On, dir: &Path) -> String {
    match on {
        On::Sqlite => crate::service::db::sqlite_url(dir),
        On::Postgres => crate::service::db::test_postgres_url("record"),
    }
}

/// A service on a fresh database (`on`) in `dir` with the repository's tracks (their baseline
/// rows are not added: `base` adds one).
pub async fn service(dir: &Path, on: On) -> Service {
    let db = Db::open(&url(on, dir)).await.unwrap();
    Service {
        db,
        tracks: crate::track::repo_tracks(),
        store: Store::new(dir),
        repo: dir.to_path_buf(),
        lease_ms: 30_000,
    }
}

/// The baseline row of `track` (what `service::prepare` adds from the track file).
pub async fn base(db: &Db, track: &str) {
    sqlx::query(
        "INSERT INTO promotions (track, seq, submission, base_commit, score, created_ms) \
         VALUES ($1, 0, NULL, 'b0', 1.0, 1)",
    )
    .bind(track)
    .execute(&db.pool)
    .await
    .unwrap();
}
