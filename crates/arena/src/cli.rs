//! The arguments of `fastdecode arena …` and `fastdecode submit`, and what each command does.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};

use crate::client::demo::DemoArgs;
use crate::service::db::now_ms;
use crate::service::state::{add_token, home, new_hidden, open_service, StateArgs};
use crate::store::Store;
use crate::track::check_name;
use crate::{client, runner, server, service, track};

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
    /// Your solver token, to see your own private runs (`--mode test|benchmark`); or
    /// $FASTDECODE_ARENA_TOKEN. Without one, only leaderboard submissions are found.
    #[arg(long, env = "FASTDECODE_ARENA_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
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
    /// The idempotency key (default: a digest of track, base, bundle, note and mode).
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// What the run is for: `test` (policy, review, build and the gate, no pricing),
    /// `benchmark` (then priced against the current base, never promoted or ranked),
    /// `profile` (a benchmark, then your build's per-op times and, on a CUDA track, its kernel
    /// timeline, printed here) — all three private to you, on their own daily quota — or
    /// `leaderboard` (the public submission).
    #[arg(long, value_enum, default_value_t = crate::api::Mode::Leaderboard)]
    pub mode: crate::api::Mode,
    /// Your own pricing of the change (`fastdecode price`'s result.json): its score, interval
    /// and machine are kept beside the arena's score, for the track's transfer ledger.
    #[arg(long, value_name = "FILE")]
    pub local_result: Option<PathBuf>,
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
            if !client::status(&a.server, a.token.as_deref(), &a.id, a.json)? {
                std::process::exit(1);
            }
            Ok(())
        }
        ArenaCmd::Admin(c) => runtime()?.block_on(admin(c)),
        ArenaCmd::Demo(a) => crate::client::demo::run(a),
        ArenaCmd::Redteam(a) => redteam(a),
    }
}

fn redteam(a: RedteamArgs) -> Result<()> {
    let mut cases = crate::client::redteam::load(&a.cases)?;
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
    let rows = crate::client::redteam::run(&api, &a.repo, &cases, |r| {
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
    eprint!("\n{}", crate::client::redteam::table(&rows));
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&rows)?)?;
    }
    if rows.iter().any(|r| !r.ok) {
        std::process::exit(1);
    }
    Ok(())
}

async fn serve(a: ServeArgs) -> Result<()> {
    let tracks = a.tracks.clone().unwrap_or_else(|| a.repo.join("tracks"));
    let s = open_service(&a.state, &a.repo, &tracks, a.lease_seconds).await?;
    let names: Vec<String> = s.tracks.keys().cloned().collect();
    server::serve(s, &a.listen, |addr| {
        eprintln!(
            "arena: listening on http://{addr} (tracks: {})",
            names.join(", ")
        );
    })
    .await
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
                let base = service::current_base(&db, &t.name).await.ok();
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
            let Some(rows) = crate::service::stages::private(&db, &a.id).await? else {
                bail!("{}: no such submission", a.id);
            };
            for r in rows {
                outln!("{r}")?;
            }
        }
        AdminCmd::Cancel(a) => {
            let stage = crate::record::cancel::cancel(&a.state.existing_db().await?, &a.id).await?;
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
        mode: a.mode,
        local_result: a.local_result,
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
