//! The arguments of `fastdecode arena …` and `fastdecode submit`, and what each command does.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};

use crate::db::{now_ms, sqlite_url, Db};
use crate::server::Service;
use crate::store::Store;
use crate::track::{check_name, Hidden};
use crate::{client, runner, server, tokens, track};

#[derive(Subcommand)]
pub enum ArenaCmd {
    /// Run the service: the API, the queue and the record (SQLite by default, PostgreSQL by URL).
    Serve(ServeArgs),
    /// Run a runner: lease jobs of its kind from a service, build, gate and price them.
    Runner(RunnerArgs),
    /// Show a submission's stages and verdict.
    Status(StatusArgs),
    /// Operator commands on the service's database and stores (tokens, tracks, hidden material).
    #[command(subcommand)]
    Admin(AdminCmd),
    /// Start a local arena (SQLite, one CPU runner, the bundled model), submit the bundled
    /// examples (a no-op, an exact speed-up, a wrong-token change) and print the leaderboard.
    Demo(DemoArgs),
    /// Run the red-team corpus (`redteam/`: cheating submissions and two honest controls)
    /// against a service and print what stopped each; exit 0 only when every case ended as its
    /// file says.
    Redteam(RedteamArgs),
}

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
        self.data.clone().unwrap_or_else(|| {
            std::env::var_os("FASTDECODE_HOME")
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/fastdecode"))
                })
                .unwrap_or_else(|| std::env::temp_dir().join("fastdecode"))
                .join("arena")
        })
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

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub state: StateArgs,
    /// The arena's git repository: holds the tracks' baselines; promotions are committed to its
    /// branches arena-base/<track>.
    #[arg(long, default_value = ".")]
    pub repo: PathBuf,
    /// The track files (default: tracks/ in --repo).
    #[arg(long)]
    pub tracks: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8417")]
    pub listen: String,
    /// Seconds a lease lasts without a heartbeat (runners beat every third of it).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(3..=3600))]
    pub lease_seconds: u64,
}

#[derive(Args)]
pub struct RunnerArgs {
    /// The service's URL.
    #[arg(long)]
    pub server: String,
    /// This runner's token (`fastdecode arena admin runner add`).
    #[arg(long)]
    pub token: String,
    /// The kind of jobs it takes (a CPU runner with cargo also builds).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
    pub kind: String,
    /// Its working directory: trees, builds, artifacts, goldens (default:
    /// $FASTDECODE_HOME/arena-runner or ~/.cache/fastdecode/arena-runner).
    #[arg(long)]
    pub cache: Option<PathBuf>,
    /// An external reviewer: a shell command given the added lines on stdin; exit 0 approves,
    /// 1 is a finding (its first output line says why), anything else an outage.
    #[arg(long)]
    pub reviewer: Option<String>,
    /// Seconds between lease requests while the queue is empty.
    #[arg(long, default_value_t = 1.0)]
    pub poll_seconds: f64,
}

#[derive(Args)]
pub struct StatusArgs {
    /// The submission's id.
    pub id: String,
    /// The service's URL.
    #[arg(long)]
    pub server: String,
    /// Print the submission as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand)]
pub enum AdminCmd {
    /// Solvers' tokens.
    #[command(subcommand)]
    Solver(TokenCmd),
    /// Runners' tokens.
    #[command(subcommand)]
    Runner(TokenCmd),
    /// List the track files with their current base and best score, checking each.
    Tracks(TracksArgs),
    /// Make new hidden material (random golden and timed-prompt seeds) in the hidden store and
    /// print its digest, for a track file's goldens.hidden.
    #[command(subcommand)]
    Hidden(HiddenCmd),
    /// Mark a submission as a cheat: it leaves the ranking, its page and evidence stay (with the
    /// reason shown). `--clear` removes the mark. The track's base is not moved: revert a
    /// promoted cheat's commit on arena-base/<track> by hand.
    Cheat(CheatArgs),
    /// Cancel a queued or running job: it ends failed with category `cancelled` (never counted
    /// against the solver's daily cap), and the runner holding it stops the stage at its next
    /// heartbeat.
    Cancel(CancelArgs),
    /// Print a submission's stage rows with what the runners kept private for the operator
    /// (a failed build's log tail, the clock's own account of a failed pricing), one JSON
    /// object a line.
    Stages(StagesArgs),
}

#[derive(Args)]
pub struct StagesArgs {
    /// The submission's id.
    pub id: String,
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Args)]
pub struct CancelArgs {
    /// The submission's id.
    pub id: String,
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Args)]
pub struct CheatArgs {
    /// The submission's id.
    pub id: String,
    /// Why (shown on its page).
    #[arg(long, required_unless_present = "clear", conflicts_with = "clear")]
    pub reason: Option<String>,
    /// Remove the mark instead.
    #[arg(long)]
    pub clear: bool,
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Subcommand)]
pub enum TokenCmd {
    /// Add one and print its token (shown once; only its hash is stored).
    Add(AddArgs),
    /// List them.
    List(ListArgs),
}

#[derive(Args)]
pub struct AddArgs {
    pub name: String,
    /// A runner's kind.
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
    pub kind: String,
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Args)]
pub struct TracksArgs {
    /// The track files.
    #[arg(long, default_value = "tracks")]
    pub tracks: PathBuf,
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Subcommand)]
pub enum HiddenCmd {
    /// Make new hidden material.
    New(HiddenNewArgs),
}

#[derive(Args)]
pub struct HiddenNewArgs {
    /// Seeds of timed prompts in the pool (one is drawn per pricing).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(8..=1024))]
    pub pool: u64,
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Args)]
pub struct DemoArgs {
    /// Directory of the demo's arena (repository clone, database, stores, logs), kept when the
    /// demo ends (default: a new temporary directory, removed when it ends).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The fastdecode checkout whose tracks and examples it uses (default: the one this binary
    /// was built from).
    #[arg(long)]
    pub repo: Option<PathBuf>,
    /// The runner's cache, kept between demos so later ones rebuild only what changed
    /// (default: $FASTDECODE_HOME/arena-demo-runner).
    #[arg(long)]
    pub cache: Option<PathBuf>,
    /// Stop after the leaderboard instead of serving the record until ctrl-c.
    #[arg(long)]
    pub exit: bool,
}

#[derive(Args)]
pub struct RedteamArgs {
    /// The service's URL.
    #[arg(long)]
    pub server: String,
    /// A solver token whose failures the tracks' daily cap allows (the corpus fails on
    /// purpose, once a case); or $FASTDECODE_ARENA_TOKEN.
    #[arg(long, env = "FASTDECODE_ARENA_TOKEN", hide_env_values = true)]
    pub token: String,
    /// The corpus: a directory of case files.
    #[arg(long, default_value = "redteam")]
    pub cases: PathBuf,
    /// The repository whose commits the tracks' bases are (the edits apply to their files).
    #[arg(long, default_value = ".")]
    pub repo: PathBuf,
    /// Only the cases whose names contain this.
    #[arg(long)]
    pub only: Option<String>,
    /// Print the rows as JSON on stdout (the table stays on stderr).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct SubmitArgs {
    /// The service's URL.
    #[arg(long)]
    pub server: String,
    /// Your solver token (`fastdecode arena admin solver add`); or $FASTDECODE_ARENA_TOKEN.
    #[arg(long, env = "FASTDECODE_ARENA_TOKEN", hide_env_values = true)]
    pub token: String,
    /// The track to submit to.
    #[arg(long)]
    pub track: String,
    /// The submission's note (Markdown): what the change does and why it is faster.
    #[arg(long)]
    pub note_file: PathBuf,
    /// The model that made the change (published with it).
    #[arg(long)]
    pub model: Option<String>,
    /// The score you measured (published beside the arena's).
    #[arg(long, allow_negative_numbers = true)]
    pub claimed_score: Option<f64>,
    /// The working tree to bundle.
    #[arg(long, default_value = ".")]
    pub repo: PathBuf,
    /// The idempotency key (default: a digest of track, base, bundle and note).
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Print the final submission as JSON (progress stays on stderr).
    #[arg(long)]
    pub json: bool,
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

pub fn arena(cmd: ArenaCmd) -> Result<()> {
    match cmd {
        ArenaCmd::Serve(a) => runtime()?.block_on(serve(a)),
        ArenaCmd::Runner(a) => {
            if !(a.poll_seconds.is_finite() && a.poll_seconds > 0.0 && a.poll_seconds <= 3600.0) {
                bail!("--poll-seconds {}: in (0, 3600]", a.poll_seconds);
            }
            let cache = a.cache.unwrap_or_else(|| home().join("arena-runner"));
            runner::run(runner::Options {
                server: a.server,
                token: a.token,
                kind: a.kind,
                cache,
                reviewer: a.reviewer,
                poll: Duration::from_secs_f64(a.poll_seconds),
            })
        }
        ArenaCmd::Status(a) => {
            if !client::status(&a.server, &a.id, a.json)? {
                std::process::exit(1);
            }
            Ok(())
        }
        ArenaCmd::Admin(c) => runtime()?.block_on(admin(c)),
        ArenaCmd::Demo(a) => crate::demo::run(a),
        ArenaCmd::Redteam(a) => redteam(a),
    }
}

fn redteam(a: RedteamArgs) -> Result<()> {
    let mut cases = crate::redteam::load(&a.cases)?;
    if let Some(o) = &a.only {
        cases.retain(|(n, _)| n.contains(o.as_str()));
        if cases.is_empty() {
            bail!(
                "--only {o}: no case of {} has it in its name",
                a.cases.display()
            );
        }
    }
    let api = crate::http::Api::new(&a.server, Some(&a.token))?;
    eprintln!(
        "redteam: {} cases from {} against {}",
        cases.len(),
        a.cases.display(),
        a.server
    );
    let rows = crate::redteam::run(&api, &a.repo, &cases, |r| {
        eprintln!(
            "  {:<32} {} ({})",
            r.case,
            if r.ok {
                "as expected:"
            } else {
                "NOT as expected:"
            },
            r.actual
        );
    })?;
    eprint!("\n{}", crate::redteam::table(&rows));
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&rows)?)?;
    }
    if rows.iter().any(|r| !r.ok) {
        std::process::exit(1);
    }
    Ok(())
}

/// `$FASTDECODE_HOME`, or `~/.cache/fastdecode`.
pub fn home() -> PathBuf {
    std::env::var_os("FASTDECODE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/fastdecode")))
        .unwrap_or_else(|| std::env::temp_dir().join("fastdecode"))
}

/// Opens everything the service needs and checks the tracks against the repository.
pub async fn service(
    state: &StateArgs,
    repo: &Path,
    tracks: &Path,
    lease_seconds: u64,
) -> Result<Service> {
    let repo = std::path::absolute(repo).with_context(|| format!("--repo {}", repo.display()))?;
    let tracks = track::load_dir(tracks)?;
    let db = state.db().await?;
    let store = Store::new(&state.data());
    server::prepare(&db, &tracks, &store, &repo).await?;
    Ok(Service {
        db,
        tracks,
        store,
        repo,
        lease_ms: lease_seconds as i64 * 1000,
    })
}

async fn serve(a: ServeArgs) -> Result<()> {
    let tracks = a.tracks.clone().unwrap_or_else(|| a.repo.join("tracks"));
    let s = service(&a.state, &a.repo, &tracks, a.lease_seconds).await?;
    let names: Vec<String> = s.tracks.keys().cloned().collect();
    server::serve(s, &a.listen, |addr| {
        eprintln!(
            "arena: listening on http://{addr} (tracks: {})",
            names.join(", ")
        );
    })
    .await
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

async fn admin(c: AdminCmd) -> Result<()> {
    use sqlx::Row;
    match c {
        AdminCmd::Solver(TokenCmd::Add(a)) => {
            // A bad name is refused before a database is made for it.
            check_name(&a.name, "NAME")?;
            let db = a.state.db().await?;
            add_token(&db, "solvers", &a.name, "", |t| outln!("{t}")).await?;
        }
        AdminCmd::Runner(TokenCmd::Add(a)) => {
            check_name(&a.name, "NAME")?;
            let db = a.state.db().await?;
            add_token(&db, "runners", &a.name, &a.kind, |t| outln!("{t}")).await?;
        }
        AdminCmd::Solver(TokenCmd::List(a)) => {
            let db = a.state.db().await?;
            for r in sqlx::query("SELECT id FROM solvers ORDER BY id")
                .fetch_all(&db.pool)
                .await?
            {
                outln!("{}", r.try_get::<String, _>("id")?)?;
            }
        }
        AdminCmd::Runner(TokenCmd::List(a)) => {
            let db = a.state.db().await?;
            for r in sqlx::query("SELECT id, kind, last_seen_ms FROM runners ORDER BY id")
                .fetch_all(&db.pool)
                .await?
            {
                let seen: Option<i64> = r.try_get("last_seen_ms")?;
                outln!(
                    "{} {} {}",
                    r.try_get::<String, _>("id")?,
                    r.try_get::<String, _>("kind")?,
                    seen.map(|s| format!("last seen {} s ago", (now_ms() - s) / 1000))
                        .unwrap_or("never seen".into())
                )?;
            }
        }
        AdminCmd::Tracks(a) => {
            let tracks = track::load_dir(&a.tracks)?;
            let db = a.state.db().await?;
            let store = Store::new(&a.state.data());
            for t in tracks.values() {
                let base = server::current_base(&db, &t.name).await.ok();
                let hidden = if store.hidden(&t.goldens.hidden)?.is_some() {
                    "present"
                } else {
                    "MISSING"
                };
                outln!(
                    "{:<14} {:<5} {:<7} base {} best {} hidden {hidden}: {}",
                    t.name,
                    t.runner_kind,
                    t.clock_track,
                    base.as_ref()
                        .map(|b| b.0[..12].to_string())
                        .unwrap_or_else(|| t.baseline[..12].to_string()),
                    base.map(|b| format!("{:.4}", b.1))
                        .unwrap_or("1.0000".into()),
                    t.description
                )?;
            }
        }
        AdminCmd::Hidden(HiddenCmd::New(a)) => {
            outln!("{}", new_hidden(&a.state.data(), a.pool as usize)?)?
        }
        AdminCmd::Cheat(a) => {
            let reason = a.reason.as_deref().map(str::trim);
            if reason.is_some_and(|r| r.is_empty() || r.len() > 2000) {
                bail!("--reason: 1 to 2000 characters");
            }
            let db = a.state.existing_db().await?;
            if !crate::record::mark_cheat(&db, &a.id, reason).await? {
                bail!("{}: no such submission", a.id);
            }
            match reason {
                Some(r) => outln!("{}: marked as a cheat ({r}); out of the ranking", a.id)?,
                None => outln!("{}: the cheat mark is removed", a.id)?,
            }
        }
        AdminCmd::Stages(a) => {
            let db = a.state.existing_db().await?;
            let Some(rows) = crate::stages::private(&db, &a.id).await? else {
                bail!("{}: no such submission", a.id);
            };
            for r in rows {
                outln!("{r}")?;
            }
        }
        AdminCmd::Cancel(a) => {
            let stage = crate::cancel::cancel(&a.state.existing_db().await?, &a.id).await?;
            outln!(
                "{}: cancelled at {stage}; a runner holding it stops at its next heartbeat",
                a.id
            )?;
        }
    }
    Ok(())
}

/// `fastdecode submit`; exits non-zero unless the submission passed.
pub fn submit(a: SubmitArgs) -> Result<()> {
    let v = client::submit(&client::SubmitOptions {
        server: a.server,
        token: a.token,
        track: a.track,
        note_file: a.note_file,
        model: a.model,
        claimed_score: a.claimed_score,
        repo: a.repo,
        idempotency_key: a.idempotency_key,
    })?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        out!("{}", client::table(&v))?;
    }
    if !client::passed(&v) {
        std::process::exit(1);
    }
    Ok(())
}
