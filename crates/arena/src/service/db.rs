//! The database: SQLite (a file, created and migrated on first use) or PostgreSQL (by URL; the
//! database created on first use too when the server has none of that name), through sqlx's `Any` driver so one set of migrations and one set of queries serve both.
//! Where the two differ (how a job is leased) `Backend` says which is in use.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::str::FromStr;

use anyhow::{Context, Result};
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::error::BoxDynError;
use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};
use sqlx::AnyPool;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

#[derive(Clone)]
pub struct Db {
    pub pool: AnyPool,
    pub backend: Backend,
}

/// The schema's migrations, in the binary: `migrations/VERSION_DESCRIPTION.sql`, in order.
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "arena", include_str!("../../migrations/0001_arena.sql")),
    (
        2,
        "record",
        include_str!("../../migrations/0002_record.sql"),
    ),
    (
        3,
        "failure blame",
        include_str!("../../migrations/0003_failure_blame.sql"),
    ),
    (
        4,
        "note html",
        include_str!("../../migrations/0004_note_html.sql"),
    ),
    (5, "modes", include_str!("../../migrations/0005_modes.sql")),
    (
        6,
        "local result",
        include_str!("../../migrations/0006_local_result.sql"),
    ),
    (
        7,
        "profiles",
        include_str!("../../migrations/0007_profiles.sql"),
    ),
];

/// `MIGRATIONS` as sqlx's migrator takes them. Built here rather than by `sqlx::migrate!`: that
/// macro compiles a second copy of sqlx with both drivers and SQLite's C source for the
/// compiler's own use, minutes of every clean build on two cores. The versions, descriptions
/// and SQL are what the macro took from the file names, so databases it migrated check out.
#[derive(Debug)]
struct Migrations;

/// What `MigrationSource::resolve` returns (sqlx's `BoxFuture`, spelled out).
type Resolved = Pin<Box<dyn Future<Output = Result<Vec<Migration>, BoxDynError>> + Send>>;

impl MigrationSource<'static> for Migrations {
    fn resolve(self) -> Resolved {
        Box::pin(async {
            Ok(MIGRATIONS
                .iter()
                .map(|&(version, description, sql)| {
                    Migration::new(
                        version,
                        description.into(),
                        MigrationType::Simple,
                        sql.into(),
                        false,
                    )
                })
                .collect())
        })
    }
}

/// Milliseconds since the Unix epoch: every time the arena stores.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A fresh random id with a readable prefix (`s-…` for submissions, …).
pub fn new_id(prefix: &str) -> String {
    let bytes: [u8; 8] = rand::random();
    format!("{prefix}-{}", hex::encode(bytes))
}

/// The URL of the default database: an SQLite file in `data`.
pub fn sqlite_url(data: &Path) -> String {
    format!("sqlite://{}", data.join("arena.db").display())
}

/// The URL of a new database, `{prefix}_{random}`, on the PostgreSQL server that
/// `tools/test.sh` starts for the tests (`FASTDECODE_TEST_POSTGRES`); `Db::open` creates it.
/// For tests, this crate's and the command line's: they fail without that server, never skip.
pub fn test_postgres_url(prefix: &str) -> String {
    let server = std::env::var("FASTDECODE_TEST_POSTGRES").expect(
        "FASTDECODE_TEST_POSTGRES is not set: run the tests with tools/test.sh (the README's \
         test command), which starts a PostgreSQL server for them",
    );
    let base = server.rsplit_once('/').map_or(server.as_str(), |(b, _)| b);
    format!("{base}/{prefix}_{}", hex::encode(rand::random::<[u8; 8]>()))
}

impl Db {
    /// Connects to `url` (`sqlite://PATH` or `postgres://…`), creating an SQLite file or a
    /// PostgreSQL database that does not exist yet, and applies the migrations.
    pub async fn open(url: &str) -> Result<Db> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Backend::Postgres
        } else {
            anyhow::bail!("--database {url}: not an sqlite:// or postgres:// URL");
        };
        let url = match backend {
            // Created on first use; sqlx's default busy timeout (5 s) makes a second writer wait
            // for the lock instead of failing.
            Backend::Sqlite if !url.contains('?') => format!("{url}?mode=rwc"),
            _ => url.to_string(),
        };
        if backend == Backend::Postgres {
            create_postgres_database(&url).await?;
        }
        let opts = AnyConnectOptions::from_str(&url)
            .with_context(|| format!("--database {}: not a database URL", redact(&url)))?;
        // Each connection to `sqlite::memory:` is a database of its own: one connection, kept
        // for the pool's life, is the one the migrations made.
        let memory = backend == Backend::Sqlite && url.contains(":memory:");
        let mut pool = AnyPoolOptions::new().max_connections(match backend {
            Backend::Sqlite => 4,
            Backend::Postgres => 8,
        });
        if memory {
            pool = pool
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None);
        }
        let pool = pool
            .connect_with(opts)
            .await
            .with_context(|| format!("--database {}: cannot connect", redact(&url)))?;
        if backend == Backend::Sqlite && !memory {
            // WAL lets readers (status requests) run beside the one writer; it is a property
            // of the file, kept once set. The first statement: where a file that is not a
            // database is found.
            sqlx::query("PRAGMA journal_mode=WAL")
                .execute(&pool)
                .await
                .with_context(|| format!("--database {}", redact(&url)))?;
        }
        Migrator::new(Migrations)
            .await
            .context("the arena's migrations")?
            .run(&pool)
            .await
            .with_context(|| format!("migrating {}", redact(&url)))?;
        Ok(Db { pool, backend })
    }
}

impl Db {
    /// A transaction that writes. On SQLite it takes the write lock at once (`BEGIN
    /// IMMEDIATE`), so two writers never both read and then fail to upgrade; on PostgreSQL rows
    /// are locked where the queries say so (`FOR UPDATE SKIP LOCKED` when leasing).
    pub async fn write(&self) -> Result<sqlx::Transaction<'static, sqlx::Any>> {
        Ok(match self.backend {
            Backend::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await?,
            Backend::Postgres => self.pool.begin().await?,
        })
    }
}

/// Creates the PostgreSQL database `url` names when its server has none of that name (SQLSTATE
/// 3D000), through the server's `postgres` database: an operator's first `arena serve` needs
/// only a role allowed to create databases, as SQLite's first run needs only a directory.
async fn create_postgres_database(url: &str) -> Result<()> {
    use sqlx::postgres::PgConnectOptions;
    use sqlx::{ConnectOptions, Connection};
    let code = |e: &sqlx::Error| match e {
        sqlx::Error::Database(d) => d.code().map(|c| c.to_string()),
        _ => None,
    };
    let opts = PgConnectOptions::from_str(url)
        .with_context(|| format!("--database {}: not a PostgreSQL URL", redact(url)))?;
    let Some(name) = opts.get_database().map(str::to_string) else {
        return Ok(());
    };
    match opts.connect().await {
        Ok(c) => {
            let _ = c.close().await;
            return Ok(());
        }
        Err(e) if code(&e).as_deref() == Some("3D000") => {}
        // Said now: the pool would retry a refused connection until its 30 s acquire timeout
        // and then report only the timeout.
        Err(e) => {
            return Err(e).with_context(|| format!("--database {}: cannot connect", redact(url)))
        }
    }
    let mut admin = opts
        .clone()
        .database("postgres")
        .connect()
        .await
        .with_context(|| {
            format!(
                "--database {}: database {name:?} does not exist, and the server's `postgres` \
                 database to create it from cannot be reached",
                redact(url)
            )
        })?;
    let create = format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\""));
    match sqlx::query(&create).execute(&mut admin).await {
        // 42P04: another process created it meanwhile.
        Err(e) if code(&e).as_deref() != Some("42P04") => Err(e)
            .with_context(|| format!("--database {}: creating database {name:?}", redact(url))),
        _ => Ok(()),
    }
}

/// A database URL without its password, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &creds[..c], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact("postgres://arena:hunter2@localhost/arena"),
            "postgres://arena:***@localhost/arena"
        );
        assert_eq!(redact("sqlite:///tmp/a.db"), "sqlite:///tmp/a.db");
    }

    /// Every file of `migrations/` is in `MIGRATIONS` under the version and description sqlx
    /// takes from its name (`0003_failure_blame.sql`: 3, "failure blame"), and nothing else is.
    #[test]
    fn every_migration_file_is_embedded_under_its_name() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let mut files: Vec<(i64, String, String)> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| {
                let path = e.unwrap().path();
                let name = path.file_stem().unwrap().to_str().unwrap().to_string();
                let (version, description) = name.split_once('_').unwrap();
                let sql = std::fs::read_to_string(&path).unwrap();
                (version.parse().unwrap(), description.replace('_', " "), sql)
            })
            .collect();
        files.sort();
        let embedded: Vec<(i64, String, String)> = MIGRATIONS
            .iter()
            .map(|&(v, d, s)| (v, d.to_string(), s.to_string()))
            .collect();
        assert_eq!(embedded, files);
    }
}
