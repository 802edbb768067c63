//! An arena's state: where it lives (`--data`, `--database`: [`StateArgs`]), opening it as a
//! [`Service`] with its tracks checked, and what an operator adds to it (accounts, hidden
//! material). The `arena` commands (`cli`) and the demo (`demo`) both start from here.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;

use crate::service::db::{now_ms, sqlite_url, Db};
use crate::service::{self, tokens, Service};
use crate::store::Store;
use crate::track::{self, check_name, Hidden};

/// Where the service keeps its state.
#[derive(Args, Clone)]
pub struct StateArgs {
    /// Database URL: sqlite://FILE or postgres://USER:PASSWORD@HOST/DB (default: an SQLite file
    /// in --data, created and migrated on first use).
    #[arg(long)]
    pub database: Option<String>,
    /// The service's directory: the default database, the artifact store, the hidden store
    /// (default: $FASTDECODE_HOME/arena or ~/.cache/fastdecode/arena).
    #[arg(long)]
    pub data: Option<PathBuf>,
}

impl StateArgs {
    pub fn data(&self) -> PathBuf {
        self.data.clone().unwrap_or_else(|| home().join("arena"))
    }

    pub async fn db(&self) -> Result<Db> {
        // A --database URL needs nothing of --data: a mistyped one leaves no directory behind.
        if let Some(url) = &self.database {
            return Db::open(url).await;
        }
        let data = self.data();
        std::fs::create_dir_all(&data).with_context(|| format!("--data {}", data.display()))?;
        Db::open(&sqlite_url(&data)).await
    }

    /// The database of an arena that must already exist (an operator's act on one of its
    /// submissions): a mistyped --data is named, never made into a new, empty arena.
    pub async fn existing_db(&self) -> Result<Db> {
        let data = self.data();
        if self.database.is_none() && !data.join("arena.db").is_file() {
            bail!(
                "--data {}: no arena there (no arena.db; `fastdecode arena serve --data` makes one)",
                data.display()
            );
        }
        self.db().await
    }
}

/// `$FASTDECODE_HOME`, or `~/.cache/fastdecode`.
pub fn home() -> PathBuf {
    std::env::var_os("FASTDECODE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/fastdecode")))
        .unwrap_or_else(|| std::env::temp_dir().join("fastdecode"))
}

/// Opens everything the service needs and checks the tracks against the repository.
pub async fn open_service(
    state: &StateArgs,
    repo: &Path,
    tracks: &Path,
    lease_seconds: u64,
) -> Result<Service> {
    let repo = std::path::absolute(repo).with_context(|| format!("--repo {}", repo.display()))?;
    let tracks = track::load_dir(tracks)?;
    let db = state.db().await?;
    let store = Store::new(&state.data());
    service::prepare(&db, &tracks, &store, &repo).await?;
    Ok(Service {
        db,
        tracks,
        store,
        repo,
        lease_ms: lease_seconds as i64 * 1000,
    })
}

/// Adds a solver or runner and returns its token. The token is handed to `deliver` before the
/// row is committed: a token that could not be delivered (stdout full or closed) leaves no
/// account behind that nobody can use, and the same name can be added again.
pub async fn add_token(
    db: &Db,
    table: &str,
    name: &str,
    kind: &str,
    deliver: impl FnOnce(&str) -> Result<()>,
) -> Result<String> {
    check_name(name, "NAME")?;
    let (token, hash) = tokens::issue(name);
    let q = match table {
        "solvers" => {
            sqlx::query("INSERT INTO solvers (id, secret_hash, created_ms) VALUES ($1, $2, $3)")
                .bind(name)
                .bind(hash)
                .bind(now_ms())
        }
        _ => sqlx::query(
            "INSERT INTO runners (id, secret_hash, kind, created_ms) VALUES ($1, $2, $3, $4)",
        )
        .bind(name)
        .bind(hash)
        .bind(kind)
        .bind(now_ms()),
    };
    let mut tx = db.write().await?;
    q.execute(&mut *tx).await.map_err(|e| match &e {
        sqlx::Error::Database(d) if d.is_unique_violation() => anyhow!("{name}: already exists"),
        _ => anyhow::Error::new(e).context(format!("adding {name}")),
    })?;
    deliver(&token)?;
    tx.commit().await?;
    Ok(token)
}

/// Writes new hidden material into the store of `data`; its digest.
pub fn new_hidden(data: &Path, pool: usize) -> Result<String> {
    let h = Hidden {
        golden_seeds: vec![rand::random::<u64>() >> 16],
        pool_seeds: (0..pool).map(|_| rand::random::<u64>() >> 16).collect(),
    };
    h.validate()?;
    Store::new(data).put_hidden(serde_json::to_string(&h)?.as_bytes())
}
