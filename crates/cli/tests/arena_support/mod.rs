//! The arena harness the end-to-end tests share (`arena.rs`, `pages.rs`): a fresh arena (a clone
//! of this checkout, its own database, stores and hidden material, the test track), its service
//! and runners as real processes, and a solver's ways of submitting.
//!
//! Every arena is a fresh clone of this checkout (the baselines are commits of its history)
//! with its own database, stores and fresh hidden material; the runners of all tests share one
//! build cache (`target/tmp/arena-runner`), so cargo builds each tree once per machine and
//! rebuilds only what a change touches. Tests run one at a time (`ONE_AT_A_TIME`): they share
//! the machine's two cores with each other's pricings.

#![allow(dead_code)] // each test binary uses its own part of this module

/// Every scenario runs on both databases: `SCENARIO::on_sqlite` and `SCENARIO::on_postgresql`,
/// one test at a time (they share the machine's cores with each other's pricings).
#[allow(unused_macros)] // arena.rs and arena_service.rs use it; the other test binaries do not
macro_rules! on_both_databases {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            use super::*;

            #[test]
            fn on_sqlite() {
                let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
                super::$scenario(Database::Sqlite);
            }

            #[test]
            fn on_postgresql() {
                let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
                super::$scenario(Database::Postgres);
            }
        }
    )*};
}

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fastdecode_arena::api::{
    encode_bundle, Accepted, LocalResult, Mode, NewSubmission, SubmissionList, SubmissionView,
    TrackView,
};
use fastdecode_arena::bundle::{pack, Content};
use fastdecode_arena::http::Api;
use fastdecode_arena::track::Track;

pub const BIN: &str = env!("CARGO_BIN_EXE_fastdecode");
pub const TRACK: &str = "serial-tiny";
pub static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The longest any wait here may take (a first build of the baseline on a busy 2-core machine
/// included) before the test fails naming what it waited for.
pub const PATIENCE: Duration = Duration::from_secs(1500);

/// Where every arena of a test run appends its stages' times when it is dropped, one JSON line
/// a stage (`tools/ci/summary.py --stages` sums them by stage at the end of the run).
pub fn stage_times_file() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("arena-stages.jsonl")
}

pub fn checkout() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `git -C dir ARGS`'s standard output, trimmed; a failure fails the test with git's message.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = fastdecode_arena::git::output(dir, args).unwrap_or_else(|e| panic!("{e:#}"));
    String::from_utf8_lossy(&out).trim().to_string()
}

pub fn fd(args: &[&str]) -> String {
    let o = Command::new(BIN).args(args).output().unwrap();
    assert!(
        o.status.success(),
        "fastdecode {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// (stage, outcome) of every row of a submission, a stage still open with an empty outcome.
pub fn rows(v: &SubmissionView) -> Vec<(String, String)> {
    v.stages
        .iter()
        .map(|s| (s.stage.clone(), s.outcome.clone().unwrap_or_default()))
        .collect()
}

/// Expected rows, written as string literals, in the form `rows` returns.
pub fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

pub fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t0.elapsed() < PATIENCE, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A process this test started, killed (by its own id) when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        if self.service.is_some() {
            let _ = self.record_stage_times();
        }
    }
}

/// Where an arena keeps its records in a test.
#[derive(Debug, Clone, Copy)]
pub enum Database {
    /// The SQLite file in the arena's data directory (what `arena serve` makes by default).
    Sqlite,
    /// A database of its own, new, on the PostgreSQL server `tools/test.sh` started (the
    /// service creates it on its first start, as it would for an operator).
    Postgres,
}

impl Database {
    /// `--database`: none for SQLite.
    pub fn url(self) -> Option<String> {
        match self {
            Database::Sqlite => None,
            Database::Postgres => Some(fastdecode_arena::service::db::test_postgres_url("arena")),
        }
    }
}

/// The track's cargo arguments built for the tests: release, with dependencies unoptimised but
/// for the few whose code the worker runs hot (as the workspace's own dev profile has them), and
/// incremental, so a candidate's build, which starts from a copy of the baseline's, recompiles
/// only what its change touched. The pinned baseline's build from nothing took 9 of the first
/// scenario's minutes with every dependency at `opt-level = 3`, under 2 like this; the worker
/// decodes the bundled model about as fast (241 against 252 tokens/s, `bench --prompt-tokens 32
/// --decode-tokens 32`, side by side), and at 29 with `half` unoptimised too.
pub fn quick_build(args: &[String]) -> Vec<String> {
    let mut settings = vec![
        "profile.release.incremental=true".to_string(),
        r#"profile.release.package."*".opt-level=0"#.to_string(),
    ];
    for hot in hot_dependencies() {
        settings.push(format!("profile.release.package.{hot}.opt-level=3"));
    }
    let mut v = args.to_vec();
    let at = v.iter().position(|a| a == "build").map_or(0, |i| i + 1);
    for s in settings.into_iter().rev() {
        v.insert(at, s);
        v.insert(at, "--config".to_string());
    }
    v
}

/// The dependencies whose own code is hot in a worker or a build's tools: those the workspace
/// `Cargo.toml` keeps optimised in its dev profile (`[profile.dev.package.NAME]`), read from it
/// so the two lists cannot drift apart. (With `half` unoptimised a worker decoded 8.5× slower.)
fn hot_dependencies() -> Vec<String> {
    let path = checkout().join("Cargo.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let doc: toml::Table = toml::from_str(&text).unwrap();
    let packages = doc["profile"]["dev"]["package"]
        .as_table()
        .unwrap_or_else(|| panic!("{}: no [profile.dev.package.*] tables", path.display()));
    let hot: Vec<String> = packages.keys().filter(|k| *k != "*").cloned().collect();
    assert!(hot.contains(&"half".to_string()), "{hot:?}");
    hot
}

/// A clock for tests that need a pricing to pass, not a precise score: exactly four pairs (the
/// clock's least), and a floor of 1e-6 that no load can make a no-op miss. If load slows each
/// window by a factor between 1 and R, every leave-one-out score of a no-op is within
/// [1/R, R], so the jackknife's log half-width is at most t(3)·√3·ln R ≤ 5.51 ln R at n = 4
/// (Stein's term, from the same four, the same), and the interval's lower end at least
/// R^−6.51: it reaches 1e-6 (`infra:inconclusive`) only if some window ran 8.3 times slower
/// than it would alone. More pairs would narrow an interval nothing here looks at: under CI's
/// load the 20 % target was rarely met, and two runners' no-ops spent 6 pairs each, a third
/// of their time for nothing. A no-op cannot be promoted by chance (it changes no file; a wider
/// interval only lowers its lower end below the best).
///
/// Its window is 8 prompt tokens and 16 decoded (the harness's are 32 and 32), and a phase runs
/// no warm-up window: nothing these tests assert depends on the window's length or on how warm
/// a phase's first window is, and the bound above holds for any window (a phase's figure is
/// the fastest of its two scored windows, [`few_windows`], so a cold first one is not its
/// figure unless both are slow). A worker's time goes to its rows (the CPU backend computes a
/// prompt's rows one by one, as it decodes), so a phase computes 48 rows beside its start-up's
/// own warm-up, where one warm-up and two scored windows of 32 + 16 computed 144: a quick
/// pricing of the pinned baseline against itself used 8.3 s of CPU instead of 13.6 (`fastdecode
/// price --pairs 4 --windows 2 --noise-windows 2`, twice each). A test whose pricing judges
/// hostile builds keeps a warm-up window (`redteam.rs`).
pub fn quick_clock(t: &mut Track) {
    t.clock.min_pairs = 4;
    t.clock.max_pairs = 4;
    t.clock.target_ci = 0.2;
    t.clock.floor = 1e-6;
    t.window.prompt_tokens = 8;
    t.window.decode_tokens = 16;
    few_windows(t);
    set_clock_arg(t, "--warmup-windows", "0");
}

/// Two scored windows a phase and two noise windows, for a test that asserts no precision
/// beyond what its own bound works out. The clock would size a phase's windows from the noise:
/// on this machine, under load, as many as fit in the phase's start-up (3-5 windows of 0.2 s
/// beside a 0.5 s start), time that narrows the interval, which these tests do not need. A
/// no-op of 4 pairs took 10.3 s instead of 14.1 s alone.
pub fn few_windows(t: &mut Track) {
    set_clock_arg(t, "--windows", "2");
    set_clock_arg(t, "--noise-windows", "2");
}

/// Sets the track's `fastdecode price` option `flag` to `value` (replacing it when present).
pub fn set_clock_arg(t: &mut Track, flag: &str, value: &str) {
    let args = &mut t.clock.extra_args;
    match args.iter().position(|a| a == flag) {
        Some(i) => args[i + 1] = value.to_string(),
        None => args.extend([flag.to_string(), value.to_string()]),
    }
}

pub struct Arena {
    pub dir: tempfile::TempDir,
    /// `--database` (none: the SQLite file in the data directory).
    pub database: Option<String>,
    /// The service's port: the one it chose on its first start (`--listen 127.0.0.1:0`, so no
    /// other process can take it between a test's choosing and the service's binding), kept by
    /// a restart, as the runners' `--server` names it.
    pub port: u16,
    pub lease_seconds: u64,
    pub service: Option<Proc>,
    /// The solver alice's token.
    pub solver: String,
}

impl Arena {
    /// A new arena on SQLite: a clone of this checkout, fresh hidden material, the test track,
    /// a solver.
    pub fn new(lease_seconds: u64) -> Arena {
        Arena::on(Database::Sqlite, lease_seconds)
    }

    /// The same on `database`.
    pub fn on(database: Database, lease_seconds: u64) -> Arena {
        Arena::on_track(database, lease_seconds, |_| {})
    }

    /// The same with the test track changed by `edit` (after the harness's own settings).
    pub fn on_track(database: Database, lease_seconds: u64, edit: impl Fn(&mut Track)) -> Arena {
        Arena::on_tracks(database, lease_seconds, &[TRACK], edit)
    }

    /// An arena serving the repository's tracks `names`, each with the test settings below and
    /// then `edit`.
    pub fn on_tracks(
        database: Database,
        lease_seconds: u64,
        names: &[&str],
        edit: impl Fn(&mut Track),
    ) -> Arena {
        let database = database.url();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        git(
            d,
            &["clone", "--quiet", &checkout().to_string_lossy(), "repo"],
        );
        let data = d.join("data");
        let hidden = fd(&[
            "arena",
            "admin",
            "hidden",
            "new",
            "--data",
            &data.to_string_lossy(),
        ]);
        std::fs::create_dir(d.join("tracks")).unwrap();
        for name in names {
            let file = checkout().join(format!("tracks/{name}.toml"));
            let mut t = Track::parse(&std::fs::read_to_string(&file).unwrap(), &file).unwrap();
            t.goldens.hidden = hidden.clone();
            t.goldens.hidden_count = 1;
            t.window.prompt_tokens = 32;
            t.window.decode_tokens = 32;
            t.clock.floor = 0.5;
            t.clock.target_ci = 0.03;
            t.clock.min_pairs = 10;
            t.clock.max_pairs = 40;
            t.clock.time_budget = 300.0;
            // Other tests' builds may share the machine: quiet means "not saturated" here.
            // Four noise windows, not sixteen, and one warm-up window a phase, not two: a
            // window of this model takes a quarter of a second, its worker starts in half of
            // one, and no test here asserts on the noise record (the clock's own tests do).
            t.clock.extra_args = [
                "--quiet-cpu",
                "1.0",
                "--quiet-wait",
                "1",
                "--noise-windows",
                "4",
                "--warmup-windows",
                "1",
            ]
            .map(String::from)
            .to_vec();
            t.caps.failures_per_day = 3;
            t.build.cargo_args = quick_build(&t.build.cargo_args);
            edit(&mut t);
            std::fs::write(
                d.join(format!("tracks/{name}.toml")),
                toml::to_string(&t).unwrap(),
            )
            .unwrap();
        }
        let mut add = vec!["arena", "admin", "solver", "add", "alice", "--data"];
        let data_arg = data.to_string_lossy();
        add.push(&data_arg);
        if let Some(db) = &database {
            add.extend(["--database", db.as_str()]);
        }
        let solver = fd(&add);
        let mut a = Arena {
            dir,
            database,
            port: 0,
            lease_seconds,
            service: None,
            solver,
        };
        a.start_service();
        a
    }

    /// `--data DIR [--database URL]` of the admin commands.
    pub fn state(&self) -> Vec<String> {
        let mut v = vec![
            "--data".to_string(),
            self.path("data").to_string_lossy().into_owned(),
        ];
        if let Some(db) = &self.database {
            v.extend(["--database".to_string(), db.clone()]);
        }
        v
    }

    pub fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts `arena serve` and waits for its listening line (which names its port).
    pub fn start_service(&mut self) {
        let mut c = Command::new(BIN)
            .args([
                "arena",
                "serve",
                "--listen",
                &format!("127.0.0.1:{}", self.port),
            ])
            .args(["--lease-seconds", &self.lease_seconds.to_string()])
            .args(self.state())
            .arg("--repo")
            .arg(self.path("repo"))
            .arg("--tracks")
            .arg(self.path("tracks"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(c.stderr.take().unwrap());
        let mut line = String::new();
        err.read_line(&mut line).unwrap();
        let port = line
            .split_once("listening on http://127.0.0.1:")
            .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok());
        self.port = port.unwrap_or_else(|| panic!("the service said: {line}"));
        std::thread::spawn(move || {
            let mut rest = String::new();
            while err.read_line(&mut rest).is_ok_and(|n| n > 0) {}
        });
        self.service = Some(Proc(c));
    }

    /// Kills the service the hard way (no shutdown of any kind), as a crash would.
    pub fn kill_service(&mut self) {
        self.service = None;
    }

    /// A CPU runner process with its own name and token, on the shared build cache.
    pub fn runner(&self, name: &str) -> Proc {
        self.runner_of_kind(name, "cpu")
    }

    /// A runner of `kind` (`cpu`: a builder too, as cargo is here; `cuda`: never a builder).
    pub fn runner_of_kind(&self, name: &str, kind: &str) -> Proc {
        let mut add = vec!["arena", "admin", "runner", "add", name, "--kind", kind]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>();
        add.extend(self.state());
        let token = fd(&add.iter().map(String::as_str).collect::<Vec<_>>());
        // CPU runners share one build cache across tests (builds are minutes); others start
        // empty, so what they run must come from the service's artifacts.
        let cache = match kind {
            "cpu" => Path::new(env!("CARGO_TARGET_TMPDIR")).join("arena-runner"),
            _ => self.path(&format!("{name}-cache")),
        };
        let log = std::fs::File::create(self.path(&format!("{name}.log"))).unwrap();
        Proc(
            Command::new(BIN)
                .args([
                    "arena",
                    "runner",
                    "--server",
                    &self.url(),
                    "--token",
                    &token,
                ])
                .args(["--kind", kind, "--poll-seconds", "0.2"])
                .arg("--cache")
                .arg(cache)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap(),
        )
    }

    pub fn api(&self) -> Api {
        Api::new(&self.url(), Some(&self.solver)).unwrap()
    }

    pub fn view(&self, id: &str) -> SubmissionView {
        self.api()
            .get_json(&format!("/api/submissions/{id}"))
            .unwrap()
    }

    pub fn track(&self) -> TrackView {
        self.api()
            .get_json(&format!("/api/tracks/{TRACK}"))
            .unwrap()
    }

    /// Posts a bundle of `entries` directly (what `submit` would never send is sent this way).
    pub fn post(&self, entries: &[(String, Content)], key: &str) -> Result<Accepted, String> {
        self.post_note(entries, key, &format!("test submission {key}"))
    }

    /// The same with its note.
    pub fn post_note(
        &self,
        entries: &[(String, Content)],
        key: &str,
        note: &str,
    ) -> Result<Accepted, String> {
        self.post_as(&self.solver, entries, key, note, Mode::Leaderboard)
    }

    /// The same by the solver holding `token`, in `mode`.
    pub fn post_as(
        &self,
        token: &str,
        entries: &[(String, Content)],
        key: &str,
        note: &str,
        mode: Mode,
    ) -> Result<Accepted, String> {
        self.post_local(token, entries, key, note, mode, None)
    }

    /// The same with the solver's local pricing (`submit --local-result`).
    pub fn post_local(
        &self,
        token: &str,
        entries: &[(String, Content)],
        key: &str,
        note: &str,
        mode: Mode,
        local_result: Option<LocalResult>,
    ) -> Result<Accepted, String> {
        let req = NewSubmission {
            track: TRACK.into(),
            note: note.to_string(),
            model: None,
            claimed_score: None,
            bundle: encode_bundle(&pack(entries).unwrap()),
            mode,
            local_result,
        };
        Api::new(&self.url(), Some(token))
            .unwrap()
            .post("/api/submissions", &req, &[("Idempotency-Key", key)])
            .map(|a| a.unwrap())
            .map_err(|e| format!("{e:#}"))
    }

    /// Waits until `stage` of submission `id` is running (open, no outcome yet).
    pub fn running(&self, id: &str, stage: &str) {
        wait_for(&format!("{stage} of {id} running"), || {
            self.view(id)
                .stages
                .iter()
                .any(|s| s.stage == stage && s.outcome.is_none())
                .then_some(())
        });
    }

    pub fn finished(&self, id: &str) -> SubmissionView {
        let v = wait_for(&format!("the verdict of {id}"), || {
            Some(self.view(id)).filter(|v| v.finished())
        });
        // Where a test's minutes go (shown with --nocapture, or when it fails).
        let took: Vec<String> = v
            .stages
            .iter()
            .filter_map(|s| {
                Some(format!(
                    "{} {:.1} s",
                    s.stage,
                    (s.ended_ms? - s.started_ms) as f64 / 1e3
                ))
            })
            .collect();
        eprintln!("{id}: {}", took.join(", "));
        self.show_failure(&v);
        v
    }

    /// What the runner kept private for the operator (the clock's account of a pricing, a
    /// worker's last words) about a failed submission, printed for the test's output (shown
    /// when it fails): the arena's directory, removed with the test, would take it.
    fn show_failure(&self, v: &SubmissionView) {
        if v.status != "failed" {
            return;
        }
        let mut args = vec!["arena", "admin", "stages", v.id.as_str()];
        let state = self.state();
        args.extend(state.iter().map(String::as_str));
        eprintln!("{}, as the operator sees it:\n{}", v.id, fd(&args));
    }

    /// Appends every finished stage of this arena's submissions to `stage_times_file()`: which
    /// test, track, stage, outcome, seconds and the runner's public detail ("built in 41 s").
    fn record_stage_times(&self) -> Option<()> {
        use std::io::Write;
        let api = self.api();
        let list: SubmissionList = api.get_json("/api/submissions?per_page=200").ok()?;
        let test = std::thread::current().name().unwrap_or("?").to_string();
        let mut lines = String::new();
        for s in list.submissions {
            let v: SubmissionView = api.get_json(&format!("/api/submissions/{}", s.id)).ok()?;
            for st in v.stages {
                let Some(end) = st.ended_ms else { continue };
                let row = serde_json::json!({
                    "test": test,
                    "track": v.track,
                    "stage": st.stage,
                    "outcome": st.outcome,
                    "seconds": (end - st.started_ms) as f64 / 1e3,
                    "detail": st.detail,
                });
                lines += &format!("{row}\n");
            }
        }
        // One write of whole lines with O_APPEND: two arenas ending at once do not interleave.
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(stage_times_file())
            .ok()?;
        f.write_all(lines.as_bytes()).ok()
    }

    /// A solver's working tree at the track's current base with `patch` (tracks/examples/)
    /// applied.
    pub fn working_tree(&self, name: &str, patch: Option<&str>) -> PathBuf {
        let w = self.path(name);
        git(
            self.dir.path(),
            &[
                "clone",
                "--quiet",
                &self.path("repo").to_string_lossy(),
                name,
            ],
        );
        git(
            &w,
            &[
                "fetch",
                "--quiet",
                "origin",
                "+refs/heads/*:refs/remotes/origin/*",
            ],
        );
        git(
            &w,
            &[
                "checkout",
                "--quiet",
                "--detach",
                &self.track().current_base,
            ],
        );
        if let Some(p) = patch {
            git(
                &w,
                &[
                    "apply",
                    &checkout().join("tracks/examples").join(p).to_string_lossy(),
                ],
            );
        }
        w
    }

    /// `fastdecode submit --json` from `tree`: (exit ok, the final view).
    pub fn submit(&self, tree: &Path, note: &str) -> (bool, SubmissionView) {
        let (ok, v, _) = self.submit_logged(tree, note);
        (ok, v)
    }

    /// The same, with what it printed while it followed the job (its stderr).
    pub fn submit_logged(&self, tree: &Path, note: &str) -> (bool, SubmissionView, String) {
        let note_file = self.path(&format!("{note}.md"));
        std::fs::write(&note_file, format!("# {note}\n")).unwrap();
        let o = Command::new(BIN)
            .args([
                "submit",
                "--server",
                &self.url(),
                "--track",
                TRACK,
                "--json",
            ])
            .arg("--note-file")
            .arg(&note_file)
            .arg("--repo")
            .arg(tree)
            .env("FASTDECODE_ARENA_TOKEN", &self.solver)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        let v: SubmissionView =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
        self.show_failure(&v);
        (o.status.success(), v, err)
    }
}
