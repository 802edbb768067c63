//! `fastdecode arena demo`: the whole challenge on one machine. A clone of this checkout is the
//! arena's repository, a second clone the solver's working tree; the service runs on SQLite
//! with fresh hidden material, one CPU runner serves it, and the bundled examples
//! (`tracks/examples/`: a no-op, an exact speed-up, a change that emits a wrong token) are
//! submitted one after another with `submit`'s own code, then the leaderboard is printed.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::api::{SubmissionList, SubmissionView, TrackView};
use crate::client;
use crate::git;
use crate::http::Api;
use crate::service::state::{add_token, home, new_hidden, open_service, StateArgs};
use crate::track::Track;

const TRACK: &str = "serial-tiny";

/// (name, patch under tracks/examples, the status it should end with, note)
const EXAMPLES: &[(&str, Option<&str>, &str, &str)] = &[
    (
        "no-op",
        None,
        "held",
        "An unmodified engine: the clock's own check (its score must be near 1.0).",
    ),
    (
        "speed-up",
        Some("speedup.patch"),
        "promoted",
        "matvec computes eight outputs at a time in two SSE registers, fed by 4x4 weight tiles \
         transposed in registers: each output is still one running sum in the reference's \
         order, so every output is bit-identical, and eight chains overlap instead of one.",
    ),
    (
        "wrong token",
        Some("wrong-token.patch"),
        "failed",
        "A deliberate bug: from position 70 on, the greedy pick is off by one id.",
    ),
];

/// The demo's track: the repository's serial-tiny with its own hidden material and a clock
/// sized for a demo on a developer's busy machine, each pricing about a minute:
///
/// - a 60 s time budget, 4 to 12 pairs, a ±5 % target: the no-op's pricing measured 301 s for
///   25 pairs at the track's own settings beside a compiler, and the speed-up is over 2×, so
///   a few pairs decide it;
/// - a floor of 0.8 (the track's is 0.95): a no-op passes unless its whole interval reaches
///   20 % below its truth. Load slows either side's windows; the pairs alternate their order, so
///   it widens the interval and moves the score by a few percent (the busy run above: 1.0031
///   [0.9670, 1.0405]), far from 0.8;
/// - a shared machine's quiet rule: a phase waits at most a second for the CPUs to calm.
fn demo_track(checkout: &Path, hidden: &str) -> Result<Track> {
    let f = checkout.join("tracks").join(format!("{TRACK}.toml"));
    let mut t = Track::parse(&crate::store::read_regular_text(&f)?, &f)?;
    t.goldens.hidden = hidden.to_string();
    t.window.prompt_tokens = 128;
    t.window.decode_tokens = 64;
    t.clock.floor = 0.8;
    t.clock.target_ci = 0.05;
    t.clock.min_pairs = 4;
    t.clock.max_pairs = 12;
    t.clock.time_budget = 60.0;
    t.clock.extra_args = vec![
        "--quiet-cpu".into(),
        "1.0".into(),
        "--quiet-wait".into(),
        "1".into(),
    ];
    t.validate()?;
    Ok(t)
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

pub fn run(a: DemoArgs) -> Result<()> {
    let checkout = match &a.repo {
        Some(r) => r.clone(),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."),
    };
    let checkout = std::path::absolute(&checkout)?;
    if !checkout
        .join("tracks")
        .join(format!("{TRACK}.toml"))
        .is_file()
    {
        bail!(
            "--repo {}: no tracks/{TRACK}.toml (give a fastdecode checkout)",
            checkout.display()
        );
    }
    let dir = match &a.dir {
        Some(d) => {
            std::fs::create_dir(d)
                .with_context(|| format!("--dir {}: must be a new directory", d.display()))?;
            d.clone()
        }
        None => tempfile::Builder::new()
            .prefix("fastdecode-arena-demo-")
            .tempdir()?
            .keep(),
    };
    // A directory of its own making goes when the demo ends as it should; one the user named
    // stays.
    let made = a.dir.is_none();
    let cache = a
        .cache
        .clone()
        .unwrap_or_else(|| home().join("arena-demo-runner"));
    eprintln!(
        "demo: in {} (runner cache {})",
        dir.display(),
        cache.display()
    );
    let (repo, solver) = (dir.join("repo"), dir.join("solver"));
    git::output(
        &dir,
        &["clone", "--quiet", &checkout.to_string_lossy(), "repo"],
    )
    .context("cloning the checkout as the arena's repository")?;
    let data = dir.join("data");
    let hidden = new_hidden(&data, 8)?;
    let track = demo_track(&checkout, &hidden)?;
    let tracks = dir.join("tracks");
    std::fs::create_dir_all(&tracks)?;
    std::fs::write(
        tracks.join(format!("{TRACK}.toml")),
        toml::to_string(&track)?,
    )?;
    git::output(
        &dir,
        &["clone", "--quiet", &repo.to_string_lossy(), "solver"],
    )?;

    let state = StateArgs {
        database: None,
        data: Some(data.clone()),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let (solver_token, runner_token, svc) = rt.block_on(async {
        let svc = open_service(&state, &repo, &tracks, 30).await?;
        let s = add_token(&svc.db, "solvers", "demo-solver", "", |_| Ok(())).await?;
        let r = add_token(&svc.db, "runners", "demo-runner", "cpu", |_| Ok(())).await?;
        anyhow::Ok((s, r, svc))
    })?;
    let (tx, rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        rt.block_on(crate::server::serve(svc, "127.0.0.1:0", move |addr| {
            let _ = tx.send(addr);
        }))
    });
    let addr = match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(a) => a,
        Err(_) => {
            return match server.join() {
                Ok(Err(e)) => Err(e),
                _ => bail!("the service did not start"),
            }
        }
    };
    let url = format!("http://{addr}");
    eprintln!("demo: the service listens on {url}");
    let log = std::fs::File::create(dir.join("runner.log"))?;
    let runner = Runner(
        Command::new(std::env::current_exe()?)
            .args([
                "arena",
                "runner",
                "--server",
                &url,
                "--token",
                &runner_token,
                "--kind",
                "cpu",
                "--cache",
            ])
            .arg(&cache)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting the runner")?,
    );
    eprintln!(
        "demo: runner {} (log {})",
        runner.0.id(),
        dir.join("runner.log").display()
    );
    let result = examples(&url, &solver_token, &solver, &checkout, &dir);
    let (board, unexpected) = match result {
        Ok(b) => b,
        Err(e) => {
            return Err(e.context(format!(
                "the demo stopped; its files stay in {} (the runner's log: runner.log)",
                dir.display()
            )));
        }
    };
    outln!("{board}")?;
    if !a.exit {
        outln!(
            "the arena serves its record on {url} (leaderboard page: {url}/tracks/{TRACK}; \
             JSON: {url}/api/tracks/{TRACK}) until ctrl-c"
        )?;
        let _ = server.join();
    }
    drop(runner);
    // Files of its own making go, unless an example surprised: then its record stays to be read.
    let remove = made && unexpected == 0;
    outln!("{}", ended(&dir, remove, &cache))?;
    if remove {
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("removing the demo's files in {}", dir.display()))?;
    }
    if unexpected > 0 {
        bail!("{unexpected} example(s) did not end as they should (see above)");
    }
    Ok(())
}

/// The demo's runner process, stopped however the demo ends (an example's error included).
struct Runner(std::process::Child);

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The demo's last words: its service has stopped, what became of its files and how to serve
/// the record again, and what the runner's cache keeps.
fn ended(dir: &Path, removed: bool, cache: &Path) -> String {
    let files = if removed {
        format!(
            "its files in {} are removed (give --dir DIR to keep them)",
            dir.display()
        )
    } else {
        let d = dir.display();
        format!(
            "its files stay in {d}; `fastdecode arena serve --data {d}/data --repo {d}/repo \
             --tracks {d}/tracks` serves the record again"
        )
    };
    format!(
        "the demo's service has stopped; {files}. The runner's cache {} keeps the pinned \
         baseline's build for later demos (remove it to start from nothing).",
        cache.display()
    )
}

/// Puts the solver's clone at `commit`, nothing left of an example's patch.
fn detach_at(solver: &Path, commit: &str) -> Result<()> {
    git::output(
        solver,
        &["checkout", "--quiet", "--force", "--detach", commit],
    )?;
    Ok(())
}

/// Submits each example and follows it to its verdict; the leaderboard, and how many examples
/// did not end as they should.
fn examples(
    url: &str,
    token: &str,
    solver: &Path,
    checkout: &Path,
    dir: &Path,
) -> Result<(String, usize)> {
    let api = Api::new(url, None)?;
    let mut unexpected = vec![];
    for (i, (name, patch, expected, note)) in EXAMPLES.iter().enumerate() {
        let t: TrackView = api.get_json(&format!("/api/tracks/{TRACK}"))?;
        git::output(
            solver,
            &[
                "fetch",
                "--quiet",
                "origin",
                "+refs/heads/*:refs/remotes/origin/*",
            ],
        )?;
        detach_at(solver, &t.current_base)?;
        if let Some(p) = patch {
            let p: PathBuf = checkout.join("tracks/examples").join(p);
            git::output(solver, &["apply", &p.to_string_lossy()])
                .with_context(|| format!("applying {}", p.display()))?;
        }
        let note_file = dir.join(format!("note-{i}.md"));
        std::fs::write(&note_file, format!("# {name}\n\n{note}\n"))?;
        eprintln!("\ndemo: submitting the {name} example");
        let v = client::submit(&client::SubmitOptions {
            server: url.to_string(),
            token: token.to_string(),
            track: TRACK.into(),
            note_file,
            model: Some("example".into()),
            claimed_score: None,
            repo: solver.to_path_buf(),
            idempotency_key: None,
            local_result: None,
            mode: crate::api::Mode::Leaderboard,
        })?;
        eprint!("{}", client::table(&v));
        if v.status != *expected {
            unexpected.push(surprise(name, expected, &v, url));
        }
        detach_at(solver, &t.current_base)?;
    }
    // A promotion re-prices what was held: follow each re-pricing to its verdict.
    let held: SubmissionList =
        api.get_json(&format!("/api/submissions?track={TRACK}&status=repriced"))?;
    for r in &held.submissions {
        let v: SubmissionView = api.get_json(&format!("/api/submissions/{}", r.id))?;
        if let Some(id) = v.repriced_as {
            eprintln!("\ndemo: {} is re-priced on the new base as {id}", v.id);
            let done = client::follow(&api, &id)?;
            eprint!("{}", client::table(&done));
        }
    }
    let t: TrackView = api.get_json(&format!("/api/tracks/{TRACK}"))?;
    let mut out = format!(
        "\nleaderboard of {} (base {}, best score {:.4})\n{:<5} {:<20} {:<14} {:>8} {:>20} {:>9} {:<9}\n",
        t.name,
        &t.current_base[..12],
        t.current_best_score,
        "rank",
        "submission",
        "solver",
        "score",
        "95 % CI",
        "ranks at",
        "status"
    );
    for r in &t.leaderboard {
        let ci = r
            .ci95
            .map(|c| format!("[{:.3}, {:.3}]", c[0], c[1]))
            .unwrap_or_default();
        out += &format!(
            "{:<5} {:<20} {:<14} {:>8.4} {:>20} {:>9.4} {:<9}\n",
            r.rank, r.submission, r.solver, r.score, ci, r.rank_score, r.status
        );
    }
    if t.leaderboard.iter().any(|r| r.status == "held") {
        out += "(a held change ranks at no more than the best it was judged against: it did \
                not show that it beats it)\n";
    }
    if unexpected.is_empty() {
        out += "every example ended as it should: the no-op held, the speed-up promoted, the \
                wrong token failed\n";
    } else {
        out += &unexpected.join("\n");
        out.push('\n');
    }
    Ok((out, unexpected.len()))
}

/// What an example that did not end as it should says, in the demo's words: a busy machine's
/// inconclusive pricing is named as such, with where to see its pairs.
fn surprise(name: &str, expected: &str, v: &SubmissionView, url: &str) -> String {
    let category = v
        .verdict
        .as_ref()
        .and_then(|x| x["category"].as_str())
        .unwrap_or("no category");
    let why = if category == "infra:inconclusive" {
        ": its interval still straddled the floor when the pricing's time ran out, so the \
         machine was too busy for the demo's clock to decide (nothing is wrong with the change)"
    } else {
        ""
    };
    format!(
        "NOT AS EXPECTED: the {name} example ended {} ({category}), not {expected}{why}; its \
         page, with the pairs plot: {url}/submissions/{}",
        v.status, v.id
    )
}
