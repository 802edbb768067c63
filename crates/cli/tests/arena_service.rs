//! The arena's answers to the red team's free abuses (issue 42; issue 43 item 7), end to end:
//! `fastdecode arena serve` on a real database (SQLite and PostgreSQL), requests over HTTP, the
//! runner's side played by this test through the runners' routes (deterministic outcomes, no
//! build), and one real runner for a cancel in the middle of a long pricing.
//!
//! - The daily cap counts unfinished submissions: bundles posted before any verdict stop at it.
//! - A runner's report of a candidate-caused infrastructure failure (`candidate_caused`) counts
//!   beyond the track's free allowance; the runner's own do not.
//! - `fastdecode arena admin cancel ID` ends a job `cancelled`; the runner pricing it is
//!   answered 409 at its next heartbeat and kills the pricing; a finished or unknown id is an
//!   error naming it.
//! - An inconclusive pricing runs once more, both rows on the record.
//! - Modes (issue 49): a `test` ends after its gate, unpriced; a `benchmark` is priced, never
//!   confirmed or promoted, and only its solver sees it (another solver and the public get 404,
//!   lists and the leaderboard leave it out, the queue shows an anonymous row); private runs
//!   have their own daily quota, which leaderboard submissions do not draw on (nor they on the
//!   failure cap); a runner leases every waiting leaderboard job before a private run.
//! - A `profile` run (issue 49): priced as a benchmark, then profiled on the same runner; its
//!   per-op table (and the SVGs the service draws from it) go to its solver alone, with the
//!   priced result; another solver and the public get 404; it counts against the private quota;
//!   a profile out of bounds is refused by the service (stored as unavailable, saying so), and
//!   the CPU bench's real `--profile` output parses as a profile.
//! - The transfer ledger (issue 49): `submit --local-result` keeps the solver's pricing beside
//!   the arena's, in the view, the list, the track's ledger and its page's plot, and the
//!   solver's ledger and page (its machines summed up); a bad one is refused naming the file or
//!   the field; a private run's stays its solver's.

#[macro_use]
mod arena_support;

use std::process::Command;

use arena_support::*;
use fastdecode_arena::api::{
    Job, LeaseRequest, Ledger, LocalMachine, LocalResult, Mode, Report, ReportReply, SolverLedger,
    SubmissionList, SubmissionView,
};
use fastdecode_arena::bundle::Content;
use fastdecode_arena::http::Api;
use fastdecode_arena::profile::{self, Profile};
use serde_json::{json, Value};

on_both_databases!(
    bad_bundles_posted_before_any_verdict_stop_at_the_cap,
    a_candidates_own_infra_failures_count_beyond_the_free_allowance,
    an_inconclusive_pricing_is_priced_again_with_both_rows_kept,
    a_cancel_stops_the_runner_pricing_the_job,
    a_test_ends_after_its_gate_unpriced,
    a_benchmark_is_priced_for_its_solver_alone_and_never_promoted,
    private_runs_have_their_own_quota,
    leaderboard_jobs_are_leased_before_private_runs,
    a_local_result_is_kept_beside_the_ranked_score,
    a_profile_run_returns_its_profile_to_its_solver_alone,
);

fn off_surface() -> Vec<(String, Content)> {
    vec![(
        "crates/clock/src/price.rs".to_string(),
        Content::File(b"// changed\n".to_vec(), 0o644),
    )]
}

/// The red team's 14 bad bundles posted before any was judged: the cap (3 on the test track)
/// takes 3, then answers 429 saying what it counted.
fn bad_bundles_posted_before_any_verdict_stop_at_the_cap(db: Database) {
    let a = Arena::on(db, 30);
    let answers: Vec<Result<String, String>> = (0..14)
        .map(|i| a.post(&off_surface(), &format!("bad-{i}")).map(|x| x.id))
        .collect();
    assert_eq!(
        answers.iter().filter(|x| x.is_ok()).count(),
        3,
        "{answers:?}"
    );
    let e = answers[3].as_ref().unwrap_err();
    assert!(
        e.contains("429")
            && e.contains("3 count against your daily cap of 3")
            && e.contains("3 submission(s) queued or running")
            && e.contains("retry after 60 s"),
        "{e}"
    );
}

/// A runner token and its client (this test plays the runner).
fn fake_runner(a: &Arena, name: &str) -> Api {
    let mut add = vec!["arena", "admin", "runner", "add", name, "--kind", "cpu"]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
    add.extend(a.state());
    let token = fd(&add.iter().map(String::as_str).collect::<Vec<_>>());
    Api::new(&a.url(), Some(&token)).unwrap()
}

fn lease(r: &Api) -> Job {
    r.post("/api/runner/lease", &LeaseRequest { builder: true }, &[])
        .unwrap()
        .expect("a job")
}

/// Reports `outcome` for `job`: the next job this runner keeps, if any.
fn report(r: &Api, job: &Job, outcome: &str, result: Value, candidate_caused: bool) -> Option<Job> {
    let rep = Report {
        submission: job.submission.clone(),
        lease_id: job.lease_id.clone(),
        stage: job.stage.clone(),
        outcome: outcome.into(),
        detail: format!("{outcome} (as this test reports it)"),
        result,
        builder: true,
        candidate_caused,
    };
    let reply: ReportReply = r.post("/api/runner/report", &rep, &[]).unwrap().unwrap();
    reply.next
}

/// Leases the next job and reports `ok` until it reaches `stage`.
fn lease_until(r: &Api, stage: &str) -> Job {
    let mut job = lease(r);
    while job.stage != stage {
        job = report(r, &job, "ok", Value::Null, false).expect("the next stage, kept");
    }
    job
}

/// Two crashes of the candidate's worker are free, the third counts; a crash of the runner's
/// own (or a report from a runner that does not say) never does.
fn a_candidates_own_infra_failures_count_beyond_the_free_allowance(db: Database) {
    let a = Arena::on(db, 30);
    let r = fake_runner(&a, "fake");
    let crash = |key: &str, candidate: Option<bool>| {
        let id = a.post(&[], key).unwrap().id;
        let job = lease_until(&r, "gate");
        assert_eq!(job.submission, id);
        let mut rep = json!({
            "submission": job.submission, "lease_id": job.lease_id, "stage": job.stage,
            "outcome": "infra:worker_crashed", "detail": "the worker exited", "result": null,
            "builder": true,
        });
        if let Some(c) = candidate {
            rep["candidate_caused"] = json!(c);
        }
        let _: Option<Value> = r.post("/api/runner/report", &rep, &[]).unwrap();
        let v = a.view(&id);
        assert_eq!(v.verdict.unwrap()["category"], "infra:worker_crashed");
    };
    crash("runner-1", Some(false));
    crash("old-runner", None);
    for i in 0..3 {
        crash(&format!("candidate-{i}"), Some(true));
    }
    a.post(&[], "queued-1").unwrap();
    a.post(&[], "queued-2").unwrap();
    let e = a.post(&[], "refused").unwrap_err();
    assert!(
        e.contains("429")
            && e.contains(
                "0 failure(s) in the last day, 1 candidate-caused infra failure(s) beyond the 2 \
                 free a day (3 in all), 2 submission(s) queued or running"
            ),
        "{e}"
    );
}

/// A pricing's private result with interval `ci` (below the current best 1.0 by the margin:
/// held, no confirmation).
fn priced(ci: [f64; 2]) -> Value {
    json!({"metrics": {"score": (ci[0] + ci[1]) / 2.0, "ci95": ci}, "pool_index": 1, "pairs": []})
}

fn an_inconclusive_pricing_is_priced_again_with_both_rows_kept(db: Database) {
    let a = Arena::on(db, 30);
    let r = fake_runner(&a, "fake");
    let id = a.post(&[], "inconclusive").unwrap().id;
    let job = lease_until(&r, "price");
    assert!(report(&r, &job, "infra:inconclusive", Value::Null, false).is_none());
    // Back in the queue at its pricing, as an expired lease's stage.
    let v = a.view(&id);
    assert_eq!(
        (v.status.as_str(), v.next_stage.as_deref()),
        ("queued", Some("price"))
    );
    let again = lease(&r);
    assert_eq!(
        (again.submission.as_str(), again.stage.as_str()),
        (id.as_str(), "price")
    );
    assert!(report(&r, &again, "ok", priced([0.97, 1.02]), false).is_none());
    let v = a.finished(&id);
    assert_eq!(
        rows(&v),
        pairs(&[
            ("policy", "ok"),
            ("review", "ok"),
            ("build", "ok"),
            ("gate", "ok"),
            ("price", "infra:inconclusive"),
            ("price", "ok"),
            ("verdict", "held"),
        ])
    );
    assert!(v.stages[4]
        .detail
        .as_deref()
        .unwrap()
        .ends_with("inconclusive once: this stage runs again"));
    // Twice: failed as before, free.
    let id = a.post(&[], "twice").unwrap().id;
    let job = lease_until(&r, "price");
    report(&r, &job, "infra:inconclusive", Value::Null, false);
    let job = lease(&r);
    report(&r, &job, "infra:inconclusive", Value::Null, false);
    let v = a.finished(&id);
    let verdict = v.verdict.clone().unwrap();
    assert_eq!(
        (verdict["stage"].as_str(), verdict["category"].as_str()),
        (Some("price"), Some("infra:inconclusive"))
    );
    let prices = rows(&v).into_iter().filter(|r| r.0 == "price").count();
    assert_eq!(prices, 2);
}

/// `fastdecode arena admin COMMAND ID` with this arena's state: (success, stdout, stderr).
fn admin(a: &Arena, command: &str, id: &str) -> (bool, String, String) {
    let o = Command::new(BIN)
        .args(["arena", "admin", command, id])
        .args(a.state())
        .output()
        .unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The processes whose parent is `pid`.
fn children(pid: u32) -> Vec<String> {
    let mut out = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let ppid = status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .map(str::trim);
        if ppid == Some(pid.to_string().as_str()) {
            out.push(status.lines().next().unwrap_or("").to_string());
        }
    }
    out
}

/// A real runner pricing a no-op for far longer than this test waits (a thousand pairs): the
/// cancel ends the job, the runner's next heartbeat (every 2 s on a 6 s lease) is answered 409,
/// and it kills the pricing and serves the next job.
fn a_cancel_stops_the_runner_pricing_the_job(db: Database) {
    let a = Arena::on_track(db, 6, |t| {
        t.clock.min_pairs = 1000;
        t.clock.max_pairs = 2000;
        t.clock.target_ci = 0.0001;
        t.clock.time_budget = 3000.0;
    });
    let runner = a.runner("r1");
    let id = a.post(&[], "long").unwrap().id;
    a.running(&id, "price");
    wait_for("r1's pricing process", || {
        (!children(runner.0.id()).is_empty()).then_some(())
    });
    // The runner's heartbeats carry the clock's own progress line: the running stage shows it.
    let progress = wait_for("the pricing's progress on the record", || {
        a.view(&id)
            .stages
            .into_iter()
            .find(|s| s.stage == "price" && s.outcome.is_none())
            .and_then(|s| s.detail)
            .filter(|d| d.contains(" of at most 2000 pairs; "))
    });
    assert!(progress.ends_with(" s)"), "{progress}");
    let (ok, out, err) = admin(&a, "cancel", &id);
    assert!(ok, "{err}");
    assert!(out.contains(&format!("{id}: cancelled at price")), "{out}");
    let stopped = format!("runner: {id} price: the lease was lost; the stage was stopped");
    wait_for("r1 stopping the pricing", || {
        std::fs::read_to_string(a.path("r1.log"))
            .ok()
            .filter(|l| l.contains(&stopped))
    });
    assert_eq!(children(runner.0.id()), Vec::<String>::new());
    let v = a.view(&id);
    assert_eq!(v.status, "failed");
    assert_eq!(v.verdict.clone().unwrap()["category"], "cancelled");
    let tail: Vec<(String, String)> = rows(&v).split_off(v.stages.len() - 2);
    assert_eq!(
        tail,
        pairs(&[("price", "cancelled"), ("verdict", "failed")])
    );
    // The runner serves on: the next job (off the surface) is judged by it.
    let next = a.post(&off_surface(), "next").unwrap().id;
    let v = a.finished(&next);
    assert_eq!(v.verdict.unwrap()["category"], "policy:off_surface");
    assert_eq!(v.stages[0].runner.as_deref(), Some("r1"));
    // A finished or unknown submission cannot be cancelled: an error naming it.
    let (ok, _, err) = admin(&a, "cancel", &id);
    assert!(
        !ok && err.contains(&id) && err.contains("already finished"),
        "{err}"
    );
    for command in ["cancel", "stages"] {
        let (ok, _, err) = admin(&a, command, "s-0000000000000000");
        assert!(
            !ok && err.contains("s-0000000000000000: no such submission"),
            "{command}: {err}"
        );
    }
    // The runner itself stayed up throughout.
    let mut runner = runner;
    assert!(runner.0.try_wait().unwrap().is_none(), "the runner exited");
}

/// A runner whose token the service refuses says so, naming the server, and exits non-zero at
/// once, instead of retrying every second forever. (The database is not what is tested.)
#[test]
fn a_runner_with_a_refused_token_says_so_and_exits() {
    let a = Arena::on(Database::Sqlite, 30);
    let log = a.path("refused.log");
    let mut runner = Proc(
        Command::new(BIN)
            .args([
                "arena",
                "runner",
                "--server",
                &a.url(),
                "--token",
                "not-a-token",
            ])
            .args(["--kind", "cpu", "--poll-seconds", "0.2", "--cache"])
            .arg(a.path("refused-cache"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let status = wait_for("the refused runner to exit", || {
        runner.0.try_wait().unwrap()
    });
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(!status.success(), "{status:?}: {said}");
    assert!(
        said.contains(&a.url()) && said.contains("token") && !said.contains("trying again"),
        "{said}"
    );
}

/// A second solver's token.
fn another_solver(a: &Arena, name: &str) -> String {
    let mut add = vec!["arena", "admin", "solver", "add", name]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
    add.extend(a.state());
    fd(&add.iter().map(String::as_str).collect::<Vec<_>>())
}

/// Posts a no-op as alice in `mode`.
fn post_mode(a: &Arena, key: &str, mode: Mode) -> Result<String, String> {
    a.post_as(&a.solver, &[], key, &format!("a {mode} run"), mode)
        .map(|x| x.id)
}

fn a_test_ends_after_its_gate_unpriced(db: Database) {
    let a = Arena::on(db, 30);
    let r = fake_runner(&a, "fake");
    let id = post_mode(&a, "test", Mode::Test).unwrap();
    let job = lease_until(&r, "gate");
    assert_eq!(job.submission, id);
    // The gate passed: no next stage, no pricing.
    assert!(report(&r, &job, "ok", Value::Null, false).is_none());
    let v = a.finished(&id);
    assert_eq!((v.mode, v.status.as_str()), (Mode::Test, "tested"));
    assert_eq!(
        rows(&v),
        pairs(&[
            ("policy", "ok"),
            ("review", "ok"),
            ("build", "ok"),
            ("gate", "ok"),
            ("verdict", "tested"),
        ])
    );
    let verdict = v.verdict.unwrap();
    assert!(verdict["score"].is_null(), "{verdict}");
    assert!(lease_none(&r), "a job was left after the test's verdict");
}

/// Whether the runner `r` finds no job.
fn lease_none(r: &Api) -> bool {
    r.post::<_, Job>("/api/runner/lease", &LeaseRequest { builder: true }, &[])
        .unwrap()
        .is_none()
}

fn list(a: &Arena, token: Option<&str>) -> Vec<(String, Mode)> {
    let l: SubmissionList = Api::new(&a.url(), token)
        .unwrap()
        .get_json("/api/submissions")
        .unwrap();
    l.submissions.into_iter().map(|s| (s.id, s.mode)).collect()
}

/// A benchmark whose pricing clears the best by far: a leaderboard submission would go on to
/// its confirmation; the benchmark ends `benchmarked`, and no one but alice learns of it.
fn a_benchmark_is_priced_for_its_solver_alone_and_never_promoted(db: Database) {
    let a = Arena::on(db, 30);
    let bob = another_solver(&a, "bob");
    let r = fake_runner(&a, "fake");
    let public_id = a.post(&[], "public").unwrap().id;
    let id = post_mode(&a, "bench", Mode::Benchmark).unwrap();
    // Waiting: the queue shows a private row, neither its id nor its solver.
    let q = a.track().queue;
    assert_eq!(q.len(), 2, "{q:?}");
    let row = q.iter().find(|q| q.private).expect("a private row");
    assert_eq!(
        (row.submission.as_str(), row.solver.as_str(), row.position),
        ("", "", Some(1))
    );
    let public = Api::new(&a.url(), None).unwrap();
    let page = public
        .get_bytes("/api/tracks/serial-tiny")
        .unwrap()
        .unwrap();
    assert!(!String::from_utf8_lossy(&page).contains(&id));
    let html = public.get_bytes("/tracks/serial-tiny").unwrap().unwrap();
    let html = String::from_utf8_lossy(&html);
    assert!(
        html.contains("a private run") && !html.contains(&id),
        "{html}"
    );
    // Another solver and the public: as if it did not exist (404, not 403).
    for (who, token) in [("bob", Some(bob.as_str())), ("the public", None)] {
        let api = Api::new(&a.url(), token).unwrap();
        let e = format!(
            "{:#}",
            api.get_json::<Value>(&format!("/api/submissions/{id}"))
                .unwrap_err()
        );
        assert!(
            e.contains("404") && e.contains(&format!("no submission {id}")),
            "{who}: {e}"
        );
        assert!(
            api.get_bytes(&format!("/submissions/{id}"))
                .unwrap()
                .is_none(),
            "{who} saw its page"
        );
        assert_eq!(
            list(&a, token),
            [(public_id.clone(), Mode::Leaderboard)],
            "{who}"
        );
    }
    // Its solver sees it, in the list and on its page (with the token).
    let ids = list(&a, Some(&a.solver));
    assert!(ids.contains(&(id.clone(), Mode::Benchmark)), "{ids:?}");
    let mine = Api::new(&a.url(), Some(&a.solver)).unwrap();
    let html = mine
        .get_bytes(&format!("/submissions/{id}"))
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&html).contains("A private benchmark run"));
    // `arena status` finds it with the token only.
    let status = |token: Option<&str>| {
        let mut c = Command::new(BIN);
        c.args(["arena", "status", &id, "--server", &a.url(), "--json"])
            .env_remove("FASTDECODE_ARENA_TOKEN");
        if let Some(t) = token {
            c.args(["--token", t]);
        }
        let o = c.output().unwrap();
        (
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (out, _) = status(Some(&a.solver));
    assert!(out.contains("\"benchmark\""), "{out}");
    let (_, err) = status(None);
    assert!(
        err.contains("404") && err.contains(&format!("no submission {id}")),
        "{err}"
    );

    // The leaderboard submission was queued first: it is leased first; fail it at policy.
    let job = lease(&r);
    assert_eq!(job.submission, public_id);
    report(&r, &job, "policy:off_surface", Value::Null, false);
    let job = lease_until(&r, "price");
    assert_eq!(job.submission, id);
    assert!(report(&r, &job, "ok", priced([1.5, 1.6]), false).is_none());
    let v = a.finished(&id);
    assert_eq!(
        (v.mode, v.status.as_str()),
        (Mode::Benchmark, "benchmarked")
    );
    let verdict = v.verdict.clone().unwrap();
    assert!(
        (verdict["score"].as_f64().unwrap() - 1.55).abs() < 1e-9,
        "{verdict}"
    );
    assert_eq!(verdict["current_best"], 1.0);
    assert!(verdict.get("confirmation").is_none(), "{verdict}");
    let tail: Vec<(String, String)> = rows(&v).split_off(v.stages.len() - 2);
    assert_eq!(tail, pairs(&[("price", "ok"), ("verdict", "benchmarked")]));
    assert!(lease_none(&r), "a confirmation was queued");
    // Not promoted, not ranked: the track is as it was.
    let t = a.track();
    assert_eq!(t.current_best_score, 1.0);
    assert_eq!(t.frontier.len(), 1);
    assert!(t.leaderboard.is_empty(), "{:?}", t.leaderboard);
    assert!(t.queue.is_empty());
}

/// A quota of 2 private runs beside the failure cap of 3: the third private run is refused,
/// saying which quota; three leaderboard submissions still go in (the private runs in flight
/// are not counted by the cap), and the fourth is refused by the cap, which counts only them.
fn private_runs_have_their_own_quota(db: Database) {
    let a = Arena::on_track(db, 30, |t| t.caps.private_runs_per_day = 2);
    post_mode(&a, "t-1", Mode::Test).unwrap();
    post_mode(&a, "b-1", Mode::Benchmark).unwrap();
    let e = post_mode(&a, "t-2", Mode::Test).unwrap_err();
    assert!(
        e.contains("429")
            && e.contains("2 private run(s) (test, benchmark or profile) in the last day")
            && e.contains("daily quota of 2 on track serial-tiny (caps.private_runs_per_day)")
            && e.contains("--mode leaderboard"),
        "{e}"
    );
    for i in 0..3 {
        a.post(&[], &format!("lb-{i}")).unwrap();
    }
    let e = a.post(&[], "lb-3").unwrap_err();
    assert!(
        e.contains("429")
            && e.contains("3 count against your daily cap of 3")
            && e.contains("3 submission(s) queued or running"),
        "{e}"
    );
    // Still refused as a private run, by its own quota.
    let e = post_mode(&a, "b-2", Mode::Benchmark).unwrap_err();
    assert!(e.contains("caps.private_runs_per_day"), "{e}");
}

/// One runner, a private run queued, then a leaderboard submission: the later leaderboard job
/// is leased first, and the positions the record shows say so.
fn leaderboard_jobs_are_leased_before_private_runs(db: Database) {
    let a = Arena::on(db, 30);
    let r = fake_runner(&a, "fake");
    let private = post_mode(&a, "early", Mode::Test).unwrap();
    assert_eq!(a.view(&private).queue_position, Some(0));
    let public = a.post(&[], "later").unwrap().id;
    assert_eq!(a.view(&public).queue_position, Some(0));
    assert_eq!(a.view(&private).queue_position, Some(1));
    let positions: Vec<(bool, Option<i64>)> = a
        .track()
        .queue
        .iter()
        .map(|q| (q.private, q.position))
        .collect();
    assert_eq!(positions, [(true, Some(1)), (false, Some(0))]);
    let job = lease(&r);
    assert_eq!(job.submission, public);
    assert_eq!(a.view(&private).queue_position, Some(0));
    // Back in the queue (failed at policy): the private run is next.
    report(&r, &job, "policy:off_surface", Value::Null, false);
    assert_eq!(lease(&r).submission, private);
}

/// A local result of `score` (±0.02) on the machine `cpu`.
fn local(score: f64, cpu: &str) -> LocalResult {
    LocalResult {
        score,
        ci95: [score - 0.02, score + 0.02],
        pairs: 12,
        track: "serial".into(),
        machine: LocalMachine {
            cpu_model: Some(cpu.into()),
            cpus: Some(2),
            gpus: vec![],
            backend: Some("cpu".into()),
        },
    }
}

/// Alice submits with `fastdecode submit --local-result` (a result.json whose machine is a
/// hostile string), the runner played here prices it held at 0.995; bob runs a private
/// benchmark with a local result of his own. The public sees alice's pair of scores in her
/// view, the list, the ledger and the track page's plot (escaped); bob's only on his own page.
fn a_local_result_is_kept_beside_the_ranked_score(db: Database) {
    let a = Arena::on(db, 30);
    let bob = another_solver(&a, "bob");
    let r = fake_runner(&a, "fake");
    let hostile = "<script>alert(1)</script> EPYC";
    let tree = a.working_tree("alice", None);
    let note = a.path("note.md");
    std::fs::write(&note, "# with my own pricing\n").unwrap();
    let submit = |result: &serde_json::Value| {
        let file = a.path("result.json");
        std::fs::write(&file, result.to_string()).unwrap();
        Command::new(BIN)
            .args(["submit", "--server", &a.url(), "--track", TRACK, "--json"])
            .arg("--note-file")
            .arg(&note)
            .arg("--repo")
            .arg(&tree)
            .arg("--local-result")
            .arg(&file)
            .env("FASTDECODE_ARENA_TOKEN", &a.solver)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let result = json!({
        "verdict": "passed", "track": "serial", "score": 1.2, "ci95": [1.18, 1.22],
        "pairs_used": 12, "prompt_tokens": 32, "decode_tokens": 32,
        "machine": {"cpu_model": hostile, "cpus": 2, "gpus": [], "backend": "cpu"},
    });
    // A result whose interval misses its score: refused before anything is sent.
    let mut bad = result.clone();
    bad["ci95"] = json!([1.3, 1.4]);
    let o = submit(&bad).wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && err.contains("result.json: ci95 [1.3, 1.4]: does not hold the score 1.2"),
        "{err}"
    );
    // The API checks the same, naming the field.
    let mut wrong = local(1.2, "x");
    wrong.track = "dflash".into();
    let e = a
        .post_local(
            &a.solver,
            &[],
            "wrong",
            "wrong",
            Mode::Leaderboard,
            Some(wrong),
        )
        .unwrap_err();
    assert!(
        e.contains("400")
            && e.contains("local_result.track \"dflash\": this track is priced on the serial"),
        "{e}"
    );
    let child = submit(&result);
    // Leased once `submit` has posted it, then played through to its pricing.
    let mut job = wait_for("alice's submission, queued", || {
        r.post::<_, Job>("/api/runner/lease", &LeaseRequest { builder: true }, &[])
            .unwrap()
    });
    while job.stage != "price" {
        job = report(&r, &job, "ok", Value::Null, false).expect("the next stage, kept");
    }
    assert!(report(&r, &job, "ok", priced([0.97, 1.02]), false).is_none());
    let o = child.wait_with_output().unwrap();
    let v: SubmissionView = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)));
    let id = v.id.clone();
    assert_eq!(v.status, "held");
    let mine = local(1.2, hostile);
    assert_eq!(v.local_result.as_ref(), Some(&mine));
    // Bob's private benchmark, with his own local result.
    let bench = a
        .post_local(
            &bob,
            &[],
            "bench",
            "bob's bench",
            Mode::Benchmark,
            Some(local(1.5, "bob's laptop")),
        )
        .unwrap()
        .id;
    let job = lease_until(&r, "price");
    assert_eq!(job.submission, bench);
    assert!(report(&r, &job, "ok", priced([1.4, 1.6]), false).is_none());
    let bobs = Api::new(&a.url(), Some(&bob)).unwrap();
    let bv: SubmissionView = bobs.get_json(&format!("/api/submissions/{bench}")).unwrap();
    assert_eq!(
        (bv.status.as_str(), bv.local_result.map(|l| l.score)),
        ("benchmarked", Some(1.5))
    );

    let public = Api::new(&a.url(), None).unwrap();
    // The view and the list, to the public: both scores.
    let pv: SubmissionView = public.get_json(&format!("/api/submissions/{id}")).unwrap();
    assert_eq!(pv.local_result.as_ref(), Some(&mine));
    assert!((pv.verdict.unwrap()["score"].as_f64().unwrap() - 0.995).abs() < 1e-9);
    let l: SubmissionList = public.get_json("/api/submissions").unwrap();
    assert_eq!(l.submissions.len(), 1);
    assert_eq!(l.submissions[0].local_result.as_ref(), Some(&mine));
    // The ledger: alice's row, never bob's benchmark.
    let ledger: Ledger = public
        .get_json(&format!("/api/tracks/{TRACK}/ledger"))
        .unwrap();
    assert_eq!(ledger.rows.len(), 1, "{ledger:?}");
    let row = &ledger.rows[0];
    assert_eq!(
        (row.submission.as_str(), row.solver.as_str()),
        (id.as_str(), "alice")
    );
    assert_eq!((&row.local, row.status.as_str()), (&mine, "held"));
    assert!((row.ranked_score - 0.995).abs() < 1e-9);
    assert_eq!(row.ranked_ci95, Some([0.97, 1.02]));
    let e = format!(
        "{:#}",
        public
            .get_json::<Value>("/api/tracks/nope/ledger")
            .unwrap_err()
    );
    assert!(e.contains("404") && e.contains("no track nope"), "{e}");
    // The track's page: the plot with alice's point and both bars, the machine escaped; bob's
    // benchmark nowhere.
    let html = public
        .get_bytes(&format!("/tracks/{TRACK}"))
        .unwrap()
        .unwrap();
    let html = String::from_utf8_lossy(&html);
    assert!(
        html.contains("id=\"ledger\"")
            && html.matches("<circle class=\"ledger\"").count() == 1
            && html.contains("class=\"local-ci\"")
            && html.contains("class=\"ranked-ci\"")
            && html.contains("class=\"identity\""),
        "{html}"
    );
    assert!(!html.contains("<script>alert"), "{html}");
    assert!(
        html.contains("&lt;script&gt;alert(1)&lt;/script&gt; EPYC"),
        "{html}"
    );
    assert!(!html.contains(&bench) && !html.contains("laptop"), "{html}");
    // Bob's page of his benchmark: his point (orange) against alice's.
    let page = bobs
        .get_bytes(&format!("/submissions/{bench}"))
        .unwrap()
        .unwrap();
    let page = String::from_utf8_lossy(&page);
    assert!(
        page.contains("id=\"local-result\"")
            && page.contains("class=\"ledger this\"")
            && page.matches("<circle class=\"ledger\"").count() == 1,
        "{page}"
    );

    // Alice's ledger, to anyone: her row, her machine summed up (0.995 against 1.2, outside
    // her interval [1.18, 1.22]).
    let al: SolverLedger = public.get_json("/api/solvers/alice/ledger").unwrap();
    let rows: Vec<(&str, &str, Mode)> = al
        .rows
        .iter()
        .map(|r| (r.submission.as_str(), r.track.as_str(), r.mode))
        .collect();
    assert_eq!(rows, [(id.as_str(), TRACK, Mode::Leaderboard)]);
    assert_eq!(al.machines.len(), 1, "{al:?}");
    let m = &al.machines[0];
    assert_eq!(
        (
            m.track.as_str(),
            m.machine.clone(),
            m.rows,
            m.within_local_ci
        ),
        (TRACK, mine.machine_line(), 1, 0)
    );
    assert!((m.ratio_mean - 0.995 / 1.2).abs() < 1e-9, "{m:?}");
    // Bob's, to bob: his benchmark (1.5 both ways). Bob has no leaderboard submission: to the
    // public and to alice there is no solver bob, so not even that he ran something shows.
    let bl: SolverLedger = bobs.get_json("/api/solvers/bob/ledger").unwrap();
    assert_eq!(bl.rows.len(), 1, "{bl:?}");
    assert_eq!(
        (bl.rows[0].submission.as_str(), bl.rows[0].mode),
        (bench.as_str(), Mode::Benchmark)
    );
    assert_eq!(
        (bl.machines[0].rows, bl.machines[0].within_local_ci),
        (1, 1)
    );
    for (who, api) in [("the public", &public), ("alice", &a.api())] {
        let e = format!(
            "{:#}",
            api.get_json::<Value>("/api/solvers/bob/ledger")
                .unwrap_err()
        );
        assert!(
            e.contains("404") && e.contains("no solver bob"),
            "{who}: {e}"
        );
        assert!(api.get_bytes("/solvers/bob").unwrap().is_none(), "{who}");
    }
    // Alice's page: her point with both bars and the diagonal, her machine escaped, linked from
    // the track's page; bob's page to bob: his benchmark, said to be private.
    let page = public.get_bytes("/solvers/alice").unwrap().unwrap();
    let page = String::from_utf8_lossy(&page);
    assert!(
        page.matches("<circle class=\"ledger\"").count() == 1
            && page.contains("class=\"identity\"")
            && page.contains("class=\"local-ci\"")
            && page.contains("class=\"ranked-ci\"")
            && page.matches("<tr class=\"machine\">").count() == 1
            && page.contains(&format!("href=\"/submissions/{id}\""))
            && page.contains("&lt;script&gt;alert(1)&lt;/script&gt; EPYC")
            && !page.contains("<script>alert")
            && !page.contains("id=\"own\""),
        "{page}"
    );
    assert!(html.contains("href=\"/solvers/alice\""), "{html}");
    let page = bobs.get_bytes("/solvers/bob").unwrap().unwrap();
    let page = String::from_utf8_lossy(&page);
    assert!(
        page.contains("id=\"own\"")
            && page.contains(&bench)
            && page.contains("(private benchmark)")
            && page.contains("bob&#39;s laptop"),
        "{page}"
    );
}

/// What a runner reports of a profile stage: the profile as `runner::profile` parses it from a
/// build's `bench --profile` output, here a hostile one's (an odd op name).
fn profile_result(ops: &str) -> Value {
    let out = format!(
        "{{\"decode_breakdown_ms_per_token\": {ops}, \"prefill_breakdown_ms\": \
         [{{\"op\": \"moe\", \"ms\": 40.0, \"launches\": 4}}]}}"
    );
    let (decode, prefill) = profile::ops_from_bench(out.as_bytes()).unwrap();
    json!({"profile": Profile {
        backend: "cpu".into(),
        prompt_tokens: 512,
        decode,
        prefill,
        timeline: None,
        note: "per-op times; no kernel timeline: a CPU track has none".into(),
    }})
}

/// A profile run priced and profiled: `profiled` with its score beside the best, its per-op
/// table in its view, `/profile`, the SVGs, its page and `arena status` for alice only; bob and
/// the public get 404 everywhere; nothing is ranked; a second profile run's out-of-bounds
/// profile is refused by the service; both count against the private quota (2).
fn a_profile_run_returns_its_profile_to_its_solver_alone(db: Database) {
    let a = Arena::on_track(db, 30, |t| t.caps.private_runs_per_day = 2);
    let bob = another_solver(&a, "bob");
    let r = fake_runner(&a, "fake");
    let id = post_mode(&a, "prof", Mode::Profile).unwrap();
    let job = lease_until(&r, "price");
    let job = report(&r, &job, "ok", priced([1.2, 1.3]), false).expect("profiled on this runner");
    assert_eq!(
        (job.submission.as_str(), job.stage.as_str()),
        (id.as_str(), "profile")
    );
    let hostile = r#"[{"op": "attention", "ms": 1.5, "launches": 4},
        {"op": "<img src=x onerror=alert(1)>", "ms": 0.25, "launches": 1}]"#;
    assert!(report(&r, &job, "ok", profile_result(hostile), false).is_none());
    let v = a.finished(&id);
    assert_eq!((v.mode, v.status.as_str()), (Mode::Profile, "profiled"));
    let verdict = v.verdict.clone().unwrap();
    assert!(
        (verdict["score"].as_f64().unwrap() - 1.25).abs() < 1e-9,
        "{verdict}"
    );
    assert_eq!(verdict["current_best"], 1.0);
    let tail: Vec<(String, String)> = rows(&v).split_off(v.stages.len() - 3);
    assert_eq!(
        tail,
        pairs(&[("price", "ok"), ("profile", "ok"), ("verdict", "profiled")])
    );
    let p = v.profile.clone().expect("the profile in its solver's view");
    let ops: Vec<&str> = p.decode.iter().map(|o| o.op.as_str()).collect();
    assert_eq!(ops, ["attention", "?img src=x onerror=alert(1)?"]);
    assert!(p.note.contains("a CPU track has none"), "{}", p.note);
    assert!(lease_none(&r), "a job was left after the profile's verdict");

    // Its solver: the profile, its SVGs (drawn by the service), its page, `arena status`.
    let mine = a.api();
    let got: Profile = mine
        .get_json(&format!("/api/submissions/{id}/profile"))
        .unwrap();
    assert_eq!(got, p);
    let svg = mine
        .get_bytes(&format!("/api/submissions/{id}/profile.svg"))
        .unwrap()
        .unwrap();
    let svg = String::from_utf8_lossy(&svg);
    assert!(
        svg.starts_with("<svg") && svg.contains("attention") && !svg.contains("<img"),
        "{svg}"
    );
    let e = format!(
        "{:#}",
        mine.get_json::<Value>(&format!("/api/submissions/{id}/timeline.svg"))
            .unwrap_err()
    );
    assert!(e.contains("404") && e.contains("no kernel timeline"), "{e}");
    let html = mine
        .get_bytes(&format!("/submissions/{id}"))
        .unwrap()
        .unwrap();
    let html = String::from_utf8_lossy(&html);
    assert!(
        html.contains("id=\"profile-decode\"") && html.contains("A private profile run"),
        "{html}"
    );
    assert!(!html.contains("<img src=x"), "an op name rendered raw");
    let o = Command::new(BIN)
        .args([
            "arena",
            "status",
            &id,
            "--server",
            &a.url(),
            "--token",
            &a.solver,
        ])
        .env_remove("FASTDECODE_ARENA_TOKEN")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("profile (cpu)") && out.contains("attention") && out.contains("ms/token"),
        "{out}"
    );

    // Bob and the public: 404 everywhere, and nothing in the lists or on the track's pages.
    for (who, token) in [("bob", Some(bob.as_str())), ("the public", None)] {
        let api = Api::new(&a.url(), token).unwrap();
        for path in [
            format!("/api/submissions/{id}"),
            format!("/api/submissions/{id}/profile"),
            format!("/api/submissions/{id}/profile.svg"),
            format!("/api/submissions/{id}/timeline.svg"),
        ] {
            let e = format!("{:#}", api.get_json::<Value>(&path).unwrap_err());
            assert!(
                e.contains("404") && e.contains(&format!("no submission {id}")),
                "{who} {path}: {e}"
            );
        }
        assert!(api
            .get_bytes(&format!("/submissions/{id}"))
            .unwrap()
            .is_none());
        assert!(list(&a, token).is_empty(), "{who}");
        for page in ["/tracks/serial-tiny", "/api/tracks/serial-tiny", "/"] {
            let b = api.get_bytes(page).unwrap().unwrap();
            let b = String::from_utf8_lossy(&b);
            assert!(!b.contains(&id) && !b.contains("onerror"), "{who} {page}");
        }
    }
    let t = a.track();
    assert_eq!(t.current_best_score, 1.0);
    assert!(t.leaderboard.is_empty(), "{:?}", t.leaderboard);

    // A second profile run whose runner reports a profile out of bounds: the service stores one
    // that says it refused it, and the run is still profiled with its pricing.
    let second = post_mode(&a, "prof-2", Mode::Profile).unwrap();
    let job = lease_until(&r, "price");
    let job = report(&r, &job, "ok", priced([0.9, 1.0]), false).unwrap();
    let mut bad = profile_result(r#"[{"op": "moe", "ms": 1, "launches": 1}]"#);
    bad["profile"]["decode"][0]["op"] = json!("<script>");
    assert!(report(&r, &job, "ok", bad, false).is_none());
    let v = a.finished(&second);
    assert_eq!(v.status, "profiled");
    let p = v.profile.unwrap();
    assert!(p.decode.is_empty(), "{p:?}");
    assert!(
        p.note.contains("the service refused the profile"),
        "{}",
        p.note
    );
    // Both count against the private quota of 2.
    let e = post_mode(&a, "bench", Mode::Benchmark).unwrap_err();
    assert!(
        e.contains("429") && e.contains("2 private run(s) (test, benchmark or profile)"),
        "{e}"
    );
}

/// The CPU bench's `--profile --json` output (the engine's own, on the bundled model) is what
/// the runner's parser takes: a per-op table of the decode step and of the prefill.
#[test]
fn the_cpu_benchs_profile_parses_as_a_profile() {
    let o = Command::new(BIN)
        .args(["bench", "--profile", "--json", "--prompt-tokens", "16"])
        .args(["--decode-tokens", "4", "--repeats", "1"])
        .args(["--block-sizes", "2", "--draft", "oracle:1"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (decode, prefill) = profile::ops_from_bench(&o.stdout).unwrap();
    let names = |ops: &[profile::OpTime]| {
        let mut v: Vec<String> = ops.iter().map(|o| o.op.clone()).collect();
        v.sort();
        v
    };
    for ops in [&decode, &prefill] {
        for op in ["attention", "attention projections", "embed", "logits"] {
            assert!(names(ops).iter().any(|n| n == op), "{op}: {ops:?}");
        }
        assert!(ops.iter().all(|o| o.ms >= 0.0 && o.calls > 0.0), "{ops:?}");
    }
}
