//! `fastdecode arena demo`: the whole challenge on one machine. A clone of this checkout is the
//! arena's repository, a second clone the solver's working tree; the service runs on SQLite
//! with fresh hidden material, one CPU runner serves it, and the bundled examples
//! (`tracks/examples/`: a no-op, an exact speed-up, a change that emits a wrong token) are
//! submitted one after another with `submit`'s own code, then the leaderboard is printed.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::api::{SubmissionList, SubmissionView, TrackView};
use crate::cli::{add_token, home, new_hidden, service, DemoArgs, StateArgs};
use crate::client;
use crate::git;
use crate::http::Api;
use crate::track::Track;

const TRACK: &str = "serial-tiny";

/// (name, patch under tracks/examples, note)
const EXAMPLES: &[(&str, Option<&str>, &str)] = &[
    (
        "no-op",
        None,
        "An unmodified engine: the clock's own check (its score must be near 1.0).",
    ),
    (
        "speed-up",
        Some("speedup.patch"),
        "matvec computes eight outputs at a time in two SSE registers, fed by 4x4 weight tiles \
         transposed in registers: each output is still one running sum in the reference's \
         order, so every output is bit-identical, and eight chains overlap instead of one.",
    ),
    (
        "wrong token",
        Some("wrong-token.patch"),
        "A deliberate bug: from position 70 on, the greedy pick is off by one id.",
    ),
];

/// The demo's track: the repository's serial-tiny with its own hidden material and a clock
/// sized for a demo (shorter windows, a 3 % precision target, a shared machine's quiet rule).
fn demo_track(checkout: &Path, hidden: &str) -> Result<Track> {
    let f = checkout.join("tracks").join(format!("{TRACK}.toml"));
    let mut t = Track::parse(&crate::store::read_regular_text(&f)?, &f)?;
    t.goldens.hidden = hidden.to_string();
    t.window.prompt_tokens = 128;
    t.window.decode_tokens = 64;
    t.clock.target_ci = 0.03;
    t.clock.min_pairs = 6;
    t.clock.max_pairs = 30;
    t.clock.time_budget = 300.0;
    t.clock.extra_args = vec![
        "--quiet-cpu".into(),
        "1.0".into(),
        "--quiet-wait".into(),
        "1".into(),
    ];
    t.validate()?;
    Ok(t)
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
        let svc = service(&state, &repo, &tracks, 30).await?;
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
    let mut runner = Command::new(std::env::current_exe()?)
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
        .context("starting the runner")?;
    eprintln!(
        "demo: runner {} (log {})",
        runner.id(),
        dir.join("runner.log").display()
    );
    let result = examples(&url, &solver_token, &solver, &checkout, &dir);
    if !a.serve || result.is_err() {
        let _ = runner.kill();
        let _ = runner.wait();
    }
    let board = result?;
    outln!("{board}")?;
    outln!(
        "the arena listens on {url} (leaderboard page: {url}/tracks/{TRACK}; JSON: \
         {url}/api/tracks/{TRACK}); its files are in {}",
        dir.display()
    )?;
    if a.serve {
        outln!("serving until ctrl-c")?;
        let _ = server.join();
        let _ = runner.kill();
        let _ = runner.wait();
    }
    Ok(())
}

fn examples(url: &str, token: &str, solver: &Path, checkout: &Path, dir: &Path) -> Result<String> {
    let api = Api::new(url, None)?;
    for (i, (name, patch, note)) in EXAMPLES.iter().enumerate() {
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
        git::output(
            solver,
            &[
                "checkout",
                "--quiet",
                "--force",
                "--detach",
                &t.current_base,
            ],
        )?;
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
        })?;
        eprint!("{}", client::table(&v));
        git::output(
            solver,
            &[
                "checkout",
                "--quiet",
                "--force",
                "--detach",
                &t.current_base,
            ],
        )?;
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
    out += "(a held change ranks at no more than the best it was judged against: it did not \
            show that it beats it)\n";
    Ok(out)
}
