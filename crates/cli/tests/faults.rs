//! The gate and the clock against faulty builds: `fastdecode-faulty` (built only with the
//! test-only `fault-injection` feature) is the real worker with one fault injected by
//! `FASTDECODE_FAULT`. Each fault must come back as what it is, never as a score; and the same
//! build priced against itself must pass, run after run.
//!
//! Every test here spawns timed worker processes, so they take turns (`LOCK`): two of this
//! binary's pricings at once would only measure each other. Another test binary runs beside
//! them in CI's other lane (tools/test.sh). The bounds below were worked out at the noisiest
//! scatter measured before the lanes (pairs scattered by 20 %); restating them at the lanes'
//! own noise is open (issue 47).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};

static LOCK: Mutex<()> = Mutex::new(());

const BIN: &str = env!("CARGO_BIN_EXE_fastdecode");
const FAULTY: &str = env!("CARGO_BIN_EXE_fastdecode-faulty");

struct Fixture {
    _tmp: tempfile::TempDir,
    model: PathBuf,
    goldens: PathBuf,
}

/// A tiny synthetic model and three goldens made from it, shared by every test.
fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let model = tmp.path().join("tiny");
        let goldens = tmp.path().join("goldens");
        let m = model.to_str().unwrap();
        ok(Command::new(BIN).args(["synth", "--preset", "tiny", "--seed", "3", "--out", m]));
        ok(Command::new(BIN)
            .args([
                "golden", "make", "--model", m, "--count", "3", "--tokens", "24", "--out",
            ])
            .arg(&goldens));
        Fixture {
            _tmp: tmp,
            model,
            goldens,
        }
    })
}

fn ok(c: &mut Command) -> Output {
    let o = c.output().expect("runs");
    assert!(
        o.status.success(),
        "{c:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Runs the gate with `fault` injected into the candidate; returns (passed, report JSON).
fn gate(fault: &str, extra: &[&str]) -> (bool, serde_json::Value) {
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("gate.json");
    let o = Command::new(BIN)
        .args([
            "gate",
            "--reference",
            BIN,
            "--candidate",
            FAULTY,
            "--timeout",
            "3",
            "--model",
        ])
        .arg(&f.model)
        .arg("--golden")
        .arg(&f.goldens)
        .arg("--json")
        .arg(&json)
        .args(extra)
        .env("FASTDECODE_FAULT", fault)
        .output()
        .unwrap();
    (o.status.success(), report(&o, &json))
}

/// The JSON report a run of the gate or the clock wrote at `path`, once it is checked that the
/// run did not panic and that its exit status says what the report's `passed` does.
fn report(o: &Output, path: &Path) -> serde_json::Value {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    let rep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(
        o.status.success(),
        rep["passed"].as_bool().unwrap(),
        "exit status and report disagree"
    );
    rep
}

fn category(rep: &serde_json::Value) -> String {
    rep["failure"]["category"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

#[test]
fn gate_names_the_category_and_step_of_each_fault() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // A harmless fault (slow) is the same tokens: the gate passes, every token exact.
    let (passed, rep) = gate("slow=1.01", &[]);
    assert!(passed, "{rep}");
    assert_eq!(rep["fidelity"]["exact"], 3 * 24);
    assert_eq!(rep["replay"]["exact"], 3 * 24);
    assert_eq!(rep["near_ties"], 0);

    let (passed, rep) = gate("wrong_token@5", &[]);
    assert!(!passed);
    assert_eq!(category(&rep), "fidelity_divergence");
    assert_eq!(rep["failure"]["step"], 5);
    assert_eq!(rep["fidelity"]["exact"], 5, "steps before k were exact");

    // Wrong only when the drafter drafts: the oracle's forced rejections cannot see it; the
    // track's own source, checked beside them, does.
    let (passed, rep) = gate("wrong_drafter@5", &[]);
    assert!(passed, "{rep}");
    let drafter = ["--draft", "drafter", "--draft-block-size", "8"];
    let (passed, rep) = gate("wrong_drafter@5", &drafter);
    assert!(!passed);
    assert_eq!(category(&rep), "dflash_inexact", "{rep}");
    assert_eq!(rep["failure"]["step"], 5);
    assert!(
        gate("slow=1.01", &drafter).0,
        "an exact build passes with its drafter"
    );

    let (passed, rep) = gate("wrong_replay@3", &[]);
    assert!(!passed);
    assert_eq!(category(&rep), "replay_divergence");
    assert_eq!(rep["failure"]["step"], 3);

    // The same wrong token inside a (huge) envelope is a near-tie, counted against the budget.
    let (passed, rep) = gate("wrong_token@5", &["--envelope", "1000", "--budget", "1000"]);
    assert!(passed, "{rep}");
    // At least the injected one per golden; the reference then judges the rest of a chain that
    // has left the golden, so later steps may be near-ties too.
    assert!(rep["fidelity"]["near_tie"].as_u64().unwrap() >= 3, "{rep}");
    assert_eq!(rep["fidelity"]["fail"], 0);
    let (passed, rep) = gate("wrong_token@5", &["--envelope", "1000", "--budget", "0"]);
    assert!(!passed);
    assert_eq!(category(&rep), "near_tie_budget");

    // Failures are redacted: no token ids or logits in the report's failure.
    let text = rep["failure"].to_string();
    assert!(
        !text.contains("logit") && !text.contains("token\""),
        "{text}"
    );
}

/// Faults of a crashing, hung or lying worker, and the gate's category for each.
const BROKEN_WORKERS: [(&str, &str); 5] = [
    ("crash", "infra:worker_crashed"),
    ("hang", "infra:worker_hung"),
    ("lie_count", "violation:token_count"),
    ("lie_vocab", "violation:token_out_of_vocab"),
    ("lie_kv", "violation:kv_ledger"),
];

#[test]
fn gate_reports_crashed_hung_and_lying_workers() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    for (fault, want) in BROKEN_WORKERS {
        let (passed, rep) = gate(fault, &[]);
        assert!(!passed, "{fault}");
        assert_eq!(category(&rep), want, "{fault}: {rep}");
        assert_eq!(rep["failure"]["side"], "candidate");
    }
}

/// Prices `candidate` against the plain build; returns (exit ok, result JSON).
///
/// The pricing aims at a 3 % half-width (10 to 40 pairs of 2 + 3 windows of 32 + 32 tokens):
/// what the assertions below need, at a few seconds a pricing on a quiet machine.
fn price(candidate: &str, fault: &str, extra: &[&str]) -> (bool, serde_json::Value) {
    price_on(None, candidate, fault, extra)
}

/// `price`, with the pricing and every process it starts confined to `cpu` when one is given.
fn price_on(
    cpu: Option<usize>,
    candidate: &str,
    fault: &str,
    extra: &[&str],
) -> (bool, serde_json::Value) {
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    // Other test binaries and developers may share this machine: quiet means "not saturated"
    // here (the policy itself is tested with a threshold no machine meets).
    let defaults = [
        ("--target-ci", "0.03"),
        ("--max-pairs", "40"),
        ("--prompt-tokens", "32"),
        ("--decode-tokens", "32"),
        ("--stall", "2"),
        ("--quiet-cpu", "1.0"),
        ("--quiet-wait", "1"),
    ];
    let mut c = Command::new(BIN);
    if let Some(cpu) = cpu {
        use std::os::unix::process::CommandExt;
        // SAFETY: between fork and exec, only the affinity system call runs.
        unsafe {
            c.pre_exec(move || pin_to(cpu));
        }
    }
    let o = c
        .args([
            "price",
            "--baseline",
            BIN,
            "--candidate",
            candidate,
            "--model",
        ])
        .arg(&f.model)
        .args(
            defaults
                .iter()
                .filter(|(k, _)| !extra.iter().any(|e| e.starts_with(k)))
                .filter(|(k, _)| {
                    // --pairs is a fixed design: no precision target, and its own budget.
                    !(["--target-ci", "--max-pairs"].contains(k)
                        && extra.iter().any(|e| e.starts_with("--pairs")))
                })
                .flat_map(|(k, v)| [*k, *v]),
        )
        .arg("--out")
        .arg(dir.path())
        .arg("--progress-file")
        .arg(dir.path().join("progress"))
        .args(extra)
        .env("FASTDECODE_FAULT", fault)
        .output()
        .unwrap();
    let res = report(&o, &dir.path().join("result.json"));
    let svg = std::fs::read_to_string(dir.path().join("pairs.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    // The progress line an arena runner forwards ends with the pricing's own count.
    let line = std::fs::read_to_string(dir.path().join("progress")).unwrap();
    let accepted = res["accepted_pair_count"].as_u64().unwrap_or(0);
    assert!(
        line.starts_with(&format!("{accepted} of at most ")) && line.contains(" pairs; "),
        "{line}"
    );
    (o.status.success(), res)
}

fn ci(r: &serde_json::Value) -> (f64, f64) {
    (
        r["ci95"][0].as_f64().unwrap(),
        r["ci95"][1].as_f64().unwrap(),
    )
}

#[test]
fn the_same_build_prices_at_one_run_after_run() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // Why this cannot fail by chance (below 1 in 1000, the bound for each assertion):
    //
    // - A no-op is rejected only when its whole 95 % interval lies below 0.95, i.e. the interval
    //   misses the true 1.0 by more than 5 %. A pricing stops with a half-width of at most 3 %
    //   (and its score at most 3 + 5 = 8 % below the truth, i.e. with a standard error of at
    //   most 1.5 %, 5.3 standard errors) or at the 40-pair budget; the noisiest pricing measured
    //   on the shared 2-core machine had pairs scattered by 20 % (standard deviation of the log
    //   score), a standard error of 3.2 % at 40 pairs, so a rejection needs the estimate 1.6
    //   standard errors plus a whole half-width (2.02 * 3.2 %) below the truth: 3.6 standard
    //   errors, P < 2e-4 a run, and P < 1e-3 for the 5 runs only at that worst noise throughout.
    //   The interval's own calibration is the simulation in `clock::score::tests`.
    // - Inconclusive is the old "passed with an interval reaching below the floor": no longer a
    //   pass, never a rejection. It needs the pair budget spent with the interval straddling,
    //   or an interval below the floor that is not without the workers' run-queue waits: at
    //   `be53d70` a CI run rejected this no-op at 0.8505 [0.7726, 0.9363] when the candidate's
    //   workers shared a CPU with clippy's jobs for whole phases, 0.9885 [0.9588, 1.0191] without
    //   the waits (`clock::price::tests` replays its pairs).
    // - The score within [0.8, 1.25]: 7 standard errors at the worst noise above.
    // - 1.0 outside the 95 % interval: Binomial(5, p) with p at most 0.07 for an interval that
    //   covers at least 93 % (the simulation's lower edge); P(X >= 4) = 1.1e-4. (The previous
    //   "at most 3 of 20" failed 1.6 % of the time with a perfect interval.) The coverage itself
    //   is measured by that simulation; five pricings here show it holds for a real build on a
    //   real machine, at half the CI time of ten.
    let runs = 5;
    let mut misses = 0;
    let mut report = vec![];
    for seed in 0..runs {
        let (passed, r) = price(BIN, "", &["--seed", &seed.to_string()]);
        let verdict = r["verdict"].as_str().unwrap().to_string();
        let (lo, hi) = ci(&r);
        let s = r["score"].as_f64().unwrap();
        report.push(format!(
            "{verdict} {s:.4} [{lo:.4}, {hi:.4}] {} pairs",
            r["pairs_used"]
        ));
        // No false rejection, ever: the floor applies to the interval, not to a noisy point.
        assert_ne!(
            verdict, "below_floor",
            "run {seed}: a no-op was rejected: {r}"
        );
        if r["without_waits"]["overruled_rejection"] == true {
            // Below the floor as priced, but not without the time the workers waited for a
            // CPU: the machine's load, not the build (`clock::price::WithoutWaits`).
            assert_eq!(verdict, "infra:inconclusive", "{r}");
            assert!(hi < 0.95, "{r}");
            assert!(
                r["without_waits"]["ci95"][1].as_f64().unwrap() >= 0.95,
                "{r}"
            );
        } else if verdict == "infra:inconclusive" {
            assert!(lo < 0.95 && 0.95 <= hi, "{r}");
            assert_ne!(r["stopping_reason"], "target_reached", "{r}");
        } else {
            assert!(passed, "run {seed}: {r}");
            assert_eq!(verdict, "passed");
        }
        assert_eq!(r["pairs_with_output_mismatch"], 0);
        // The same build's timed outputs are the baseline's: nothing for the judge.
        assert_eq!(r["timed_fidelity"]["judged_windows"], 0, "{r}");
        assert!(r["timed_fidelity"]["windows"].as_u64().unwrap() >= 2, "{r}");
        assert!(lo <= s && s <= hi, "{r}");
        assert!((0.8..1.25).contains(&s), "run {seed}: a no-op scored {s}");
        let used = r["pairs_used"].as_u64().unwrap();
        assert_eq!(r["accepted_pair_count"], used);
        assert!((10..=40).contains(&used), "{r}");
        match r["stopping_reason"].as_str().unwrap() {
            "target_reached" => assert!(r["half_width"].as_f64().unwrap() <= 0.03),
            "pair_budget" => assert_eq!(used, 40),
            // Disturbed pairs re-run until the attempts (twice the pair budget) are spent.
            "attempt_budget" => assert_eq!(r["attempted_pair_count"], 80),
            other => panic!("run {seed} stopped by {other}: {r}"),
        }
        misses += !(lo <= 1.0 && 1.0 <= hi) as usize;
        // The original's metric names, and the robust statistic and the noise beside them.
        for key in [
            "ratio_of_means",
            "median",
            "min",
            "baseline_seconds_per_token",
            "candidate_seconds_per_token",
            "half_width",
        ] {
            assert!(r[key].as_f64().is_some_and(|v| v > 0.0), "{key} missing");
        }
        assert_eq!(r["ratio_of_means"], r["score"]);
        assert!(r["mean_statistic"]["score"].as_f64().unwrap() > 0.0);
        assert!(r["noise"]["relative_spread"].as_f64().unwrap() >= 0.0);
        assert_eq!(r["noise"]["window_seconds"].as_array().unwrap().len(), 16);
        assert_eq!(r["weights_digest"].as_str().unwrap().len(), 64);
        // Every phase ran every prompt of the pool once, warm-up first, in the pair's order:
        // the same prompts for both sides, never the same one twice in one worker.
        let k = r["windows_per_phase"].as_u64().unwrap() as usize;
        let warm = r["warmup_windows"].as_u64().unwrap() as usize;
        for pair in r["pairs"].as_array().unwrap() {
            let order: Vec<u64> = pair["prompt_order"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            let mut sorted = order.clone();
            sorted.sort();
            assert_eq!(sorted, (0..(k + warm) as u64).collect::<Vec<_>>());
            for ph in pair["phases"].as_array().unwrap() {
                let w = ph["windows"].as_array().unwrap();
                let ran: Vec<u64> = w.iter().map(|x| x["prompt"].as_u64().unwrap()).collect();
                assert_eq!(ran, order);
                let warmups = w.iter().filter(|x| x["warmup"] == true).count();
                assert_eq!(warmups, warm);
                // The phase's best window is over all its scored windows; the clean ones are
                // counted.
                let scored: Vec<&serde_json::Value> = w[warm..].iter().collect();
                let clean = scored.iter().filter(|x| x["disturbed"] == false).count();
                assert_eq!(ph["undisturbed_windows"], clean);
                let min = scored
                    .iter()
                    .map(|x| x["window_seconds"].as_f64().unwrap())
                    .fold(f64::INFINITY, f64::min);
                assert!((ph["min_window_seconds"].as_f64().unwrap() - min).abs() < 1e-12);
            }
        }
    }
    assert!(
        misses <= 3,
        "1.0 outside the interval in {misses} of {runs} runs: {report:#?}"
    );
    eprintln!("no-op: 1.0 outside the interval in {misses}/{runs} runs: {report:#?}");
}

/// A build that decodes its whole window before it says `seeded` (moving all of the decode's
/// time into what a `seeded`-split clock would call prefill) saves nothing in all: priced on
/// whole windows it is a no-op. Split at `seeded`, its decode read as zero time (a cheat of this
/// kind was promoted at 2.7 on the serial track and 8.6 on the dflash one).
#[test]
fn moving_work_before_the_seeded_line_scores_one() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // Bounds as for the no-op above (the same build, only its `seeded` line moved): never
    // rejected, the score within [0.8, 1.25] (7 standard errors at the worst noise measured).
    for extra in [
        &[][..],
        &[
            "--track",
            "dflash",
            "--block-size",
            "4",
            "--draft",
            "oracle:0.8",
        ][..],
    ] {
        let (_, r) = price(FAULTY, "shift", extra);
        let v = r["verdict"].as_str().unwrap();
        assert!(v == "passed" || v == "infra:inconclusive", "{extra:?}: {r}");
        let s = r["score"].as_f64().unwrap();
        assert!(
            (0.8..1.25).contains(&s),
            "{extra:?}: a shifted no-op scored {s}"
        );
        // The worker's `seeded` stamps are recorded, and its candidate's say the window ended
        // at once after them; nothing priced rests on them.
        let w = &r["pairs"][0]["phases"];
        let cand = w
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["role"] == "candidate")
            .unwrap();
        let win = &cand["windows"][0];
        let (seeded, whole) = (
            win["seeded_seconds"].as_f64().unwrap(),
            win["window_seconds"].as_f64().unwrap(),
        );
        assert!(whole - seeded < 0.2 * whole, "{win}");
    }
}

#[test]
fn a_quarter_slower_candidate_fails_the_floor() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // The true score is 0.8. A run escapes the floor only with its interval reaching 0.95, 19 %
    // above the truth: at the worst noise measured (a standard error of 3.2 % at the 40-pair
    // budget, half-width 6.4 %) the estimate must be 0.886, 2.7 standard errors high, P < 3.5e-3
    // a run; two escapes in three runs then have P < 3 * 3.5e-3^2 = 3.7e-5. A score of 0.9 or
    // more is 3.9 standard errors high (P < 5e-5 a run), 1.0 or more 7.8.
    let mut rejected = 0;
    let mut seen = vec![];
    for seed in 0..3 {
        let (passed, r) = price(FAULTY, "slow=1.25", &["--seed", &seed.to_string()]);
        let s = r["score"].as_f64().unwrap();
        assert!(
            s < 1.0,
            "run {seed}: a quarter slower build scored {s}: {r}"
        );
        assert!(s < 0.9, "run {seed}: score {s}");
        seen.push(format!("{} {s:.4} {:?}", r["verdict"], ci(&r)));
        if passed {
            continue;
        }
        if r["verdict"] == "below_floor" {
            assert!(r["ci95"][1].as_f64().unwrap() < 0.95);
            rejected += 1;
            if rejected == 2 {
                return;
            }
        }
    }
    panic!("the floor rejected a quarter slower build in only {rejected} of 3 runs: {seen:?}");
}

#[test]
fn dflash_track_normalises_by_the_noop_in_the_same_run() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // Bounds as for the serial no-op above: no rejection, the score within [0.8, 1.25].
    let dflash = ["--track=dflash", "--block-size=4", "--draft=oracle:0.8"];
    let (_, r) = price(BIN, "", &dflash);
    assert_ne!(r["verdict"], "below_floor", "{r}");
    assert!(
        r["verdict"] == "passed" || r["verdict"] == "infra:inconclusive",
        "{r}"
    );
    let (raw, noop, s) = (
        r["raw_ratio_of_means"].as_f64().unwrap(),
        r["noop_reference"].as_f64().unwrap(),
        r["score"].as_f64().unwrap(),
    );
    assert!((raw / noop - s).abs() < 1e-9);
    assert!((0.8..1.25).contains(&s), "{s}");
    assert!(r["noop_seconds_per_token"].as_f64().unwrap() > 0.0);
    // Two phases a pair, the no-op's and the candidate's: the serial baseline cancels out of
    // the score, and its figures for the raw ratio come from the pool's windows.
    let roles: Vec<&str> = r["pairs"][0]["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|ph| ph["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["noop", "candidate"]);
    assert!(r["baseline"]["build"].is_object(), "{}", r["baseline"]);
}

/// A build that behaves differently only in the timed windows (here: one wrong token in each,
/// which the gate would have caught, but the gate's goldens can have other shapes than the
/// window) is judged there by the live reference with the gate's rule: outside the envelope a
/// violation, never a score; inside it a near-tie, counted against the budget.
#[test]
fn a_timed_output_the_reference_disowns_is_a_violation() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (passed, r) = price(FAULTY, "wrong_token@5", &[]);
    assert!(!passed);
    assert_eq!(r["verdict"], "violation:timed_fidelity_divergence", "{r}");
    assert!(r["score"].is_null() && r["ci95"].is_null(), "scored: {r}");
    let detail = r["detail"].as_str().unwrap();
    assert!(detail.contains("at step 5"), "{detail}");
    // Caught after the first pair, every output before the injected token exact.
    assert_eq!(r["attempted_pair_count"], 1, "{r}");
    let t = &r["timed_fidelity"];
    assert_eq!(t["judged_windows"], 1, "{t}");
    assert_eq!(t["tokens"]["fail"], 1, "{t}");
    assert_eq!(t["tokens"]["near_tie"], 0, "{t}");

    // Inside a huge envelope the same token is a near-tie: priced as usual, the near-ties
    // counted over the candidate's distinct timed tokens...
    let wide = ["--envelope", "1000", "--pairs", "4"];
    let (_, r) = price(
        FAULTY,
        "wrong_token@5",
        &[&wide[..], &["--budget", "1000"]].concat(),
    );
    assert!(r["score"].is_number(), "{r}");
    assert!(
        !r["verdict"].as_str().unwrap().starts_with("violation:"),
        "{r}"
    );
    let t = &r["timed_fidelity"];
    let windows = t["windows"].as_u64().unwrap();
    assert!(windows >= 2, "{t}");
    assert_eq!(t["judged_windows"].as_u64().unwrap(), windows, "{t}");
    assert!(t["tokens"]["near_tie"].as_u64().unwrap() >= windows, "{t}");
    assert_eq!(t["tokens"]["fail"], 0, "{t}");
    // Every token of every distinct window judged: the prefill's token and 32 decoded.
    let judged = t["tokens"]["exact"].as_u64().unwrap() + t["tokens"]["near_tie"].as_u64().unwrap();
    assert_eq!(judged, windows * 33, "{t}");
    // ...and past the budget they are a violation.
    let (passed, r) = price(
        FAULTY,
        "wrong_token@5",
        &[&wide[..], &["--budget", "0"]].concat(),
    );
    assert!(!passed);
    assert_eq!(r["verdict"], "violation:timed_near_tie_budget", "{r}");
    assert!(r["score"].is_null(), "{r}");
}

#[test]
fn price_reports_crashed_hung_and_lying_workers_and_never_scores_them() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    for (fault, gate_says) in BROKEN_WORKERS {
        // A hang is the gate's timeout, but what the clock's stall watch catches.
        let want = gate_says.replace("worker_hung", "worker_stalled");
        let (passed, r) = price(FAULTY, fault, &[]);
        assert!(!passed, "{fault}");
        assert_eq!(r["verdict"], want, "{fault}");
        assert!(
            r["score"].is_null() && r["ci95"].is_null(),
            "{fault} was scored: {r}"
        );
    }
}

/// Four pairs on a machine that is never quiet enough: a busy fraction below zero, which no
/// machine's is.
const NEVER_QUIET: [&str; 3] = ["--quiet-cpu=-1", "--quiet-wait=0.1", "--pairs=4"];

#[test]
fn a_machine_that_never_quiets_gives_infra_not_a_score() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // With --require-quiet every pair is re-run until the attempts (twice the pairs) are spent.
    let (passed, r) = price(BIN, "", &[&NEVER_QUIET[..], &["--require-quiet"]].concat());
    assert!(!passed);
    assert_eq!(r["verdict"], "infra:too_few_accepted_pairs", "{r}");
    assert!(r["score"].is_null());
    assert_eq!(r["accepted_pair_count"], 0);
    assert_eq!(r["attempted_pair_count"], 8);
    assert_eq!(r["stopping_reason"], "attempt_budget");
    assert_eq!(r["pairs"][0]["rejected_because"], "not_quiescent");
    assert_eq!(r["pairs"][0]["phases"][0]["quiet"]["quiet"], false);
}

#[test]
fn a_machine_that_never_quiets_is_recorded_and_priced_unless_quiet_is_required() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (_, r) = price(BIN, "", &NEVER_QUIET);
    // Four pairs, whatever the noise: done, or (their interval straddling the floor) the
    // budget of four spent and the verdict inconclusive.
    assert_eq!(r["accepted_pair_count"], 4, "{r}");
    match r["stopping_reason"].as_str().unwrap() {
        "pairs_done" => assert!(r["verdict"] == "passed" || r["verdict"] == "below_floor"),
        "pair_budget" => assert_eq!(r["verdict"], "infra:inconclusive"),
        other => panic!("stopped by {other}: {r}"),
    }
    let ph = &r["pairs"][0]["phases"][0];
    assert_eq!(ph["quiet"]["quiet"], false);
    assert!(ph["quiet"]["waited_seconds"].as_f64().unwrap() >= 0.1);
}

#[test]
fn price_checks_its_options_before_any_worker_starts() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    // `command` with the fixture's model, output into `dir` and `args`: must exit non-zero; its
    // standard error.
    let refused = |command: &[&str], args: &[&str]| {
        let o = Command::new(BIN)
            .args(command)
            .arg("--model")
            .arg(&f.model)
            .arg("--out")
            .arg(dir.path())
            .args(args)
            .output()
            .unwrap();
        assert!(!o.status.success(), "{command:?} {args:?}");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    for (args, want) in [
        (&["--floor", "NaN"][..], "--floor NaN"),
        (&["--floor", "0"], "--floor 0"),
        (&["--pairs", "2"], "--pairs 2"),
        (&["--pairs", "6", "--max-pairs", "5"], "--max-pairs 5"),
        (&["--target-ci", "0"], "--target-ci 0"),
        (&["--target-ci", "inf"], "--target-ci inf"),
        (&["--min-pairs", "3"], "--min-pairs 3"),
        (&["--time-budget=-1"], "--time-budget -1"),
        (&["--time-budget", "NaN"], "--time-budget NaN"),
        (&["--prompt-tokens", "0"], "--prompt-tokens 0"),
        (&["--noise-windows", "1"], "--noise-windows 1"),
        (&["--windows", "0"], "--windows 0"),
        (&["--stall", "0"], "--stall 0"),
        (&["--quiet-wait", "inf"], "--quiet-wait inf"),
        (&["--outlier-factor", "1"], "--outlier-factor 1"),
        // Checked by clap (shared with the other worker-driving commands): its message.
        (&["--timeout", "NaN"], "'NaN' for '--timeout"),
        (&["--draft", "junk"], "--draft junk"),
        (
            &[
                "--track",
                "dflash",
                "--draft",
                "oracle:0.5",
                "--block-size",
                "40",
            ],
            "--block-size 40",
        ),
        (
            &["--track", "dflash", "--draft", "oracle:2"],
            "--draft oracle:2",
        ),
    ] {
        let err = refused(&["price", "--baseline", "/nonexistent/build"], args);
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        // Checked before the builds are even looked for, and nothing was priced.
        assert!(!err.contains("no such build"), "{err}");
        assert!(!dir.path().join("result.json").exists());
    }
    for (args, want) in [
        (&["--load", "1"][..], "--load 1"),
        (&["--load=-0.5"], "--load -0.5"),
        (&["--runs", "0"], "--runs 0"),
        (&["--slowdown", "NaN"], "--slowdown NaN"),
        (
            &["--faulty", "/nonexistent/faulty"],
            "--faulty /nonexistent/faulty",
        ),
        (&["--target-ci", "2"], "--target-ci 2"),
    ] {
        let err = refused(&["price", "selftest"], args);
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!dir.path().join("selftest.json").exists());
    }
}

#[test]
fn a_hung_worker_times_out_when_no_sampler_watches() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // golden make drives its worker without telemetry: only the request timeout can catch a hang.
    let f = fixture();
    let out = tempfile::tempdir().unwrap();
    let o = Command::new(BIN)
        .args([
            "golden",
            "make",
            "--reference",
            FAULTY,
            "--timeout",
            "2",
            "--count",
            "1",
            "--model",
        ])
        .arg(&f.model)
        .arg("--out")
        .arg(out.path())
        .env("FASTDECODE_FAULT", "hang")
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("infra:worker_hung"), "{err}");
}

/// The clock observes a sandboxed worker (the arena's sandbox: the worker is a grandchild of
/// what `price` spawns, in its own PID namespace): with its core kept busy beside it, its
/// windows are seen waiting on a run queue and marked disturbed, and a busy window longer than
/// the stall guard is not taken for a stall. Reading only the spawned process (the idle
/// `bwrap` above the worker), every window showed no CPU and no wait, none was ever disturbed,
/// and the stall guard killed any window longer than it.
#[test]
fn the_clock_sees_a_sandboxed_worker() {
    use fastdecode_arena::runner::sandbox::{Mount, Sandbox};
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let f = fixture();
    let sandbox = Sandbox::find("cpu").expect("bubblewrap is installed (tools/test.sh)");
    let dir = tempfile::tempdir().unwrap();
    let wrapper = sandbox
        .wrapper(
            std::path::Path::new(BIN),
            &[Mount::same(&f.model)],
            &[],
            &dir.path().join("candidate"),
        )
        .unwrap();
    // One spinner for the whole pricing, on the one core the pricing and its workers are
    // confined to: every window shares that core with it (half of it, as CFS shares), and the
    // machine's other core stays the other tests'. (Two spinners on both cores took the whole
    // machine for the test's two to three minutes under CI's lanes.)
    let cpu = first_allowed_cpu();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spinner = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            pin_to(cpu).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::hint::black_box(0u64);
            }
        })
    };
    // The stall guard at 1 s: a worker that progresses is never that long without the CPU
    // (its run time, from schedstat, in nanoseconds) unless hundreds of threads are runnable
    // (CFS serves each of N within about N × 3 ms). At 0.2 s it fired in a CI run where the
    // other lane's builds and pricings shared the cores with two spinners (the worker had a
    // quarter of a core). A window of 2400 tokens takes 2 s alone (0.86 ms a token), so it
    // runs longer than the guard whatever the load.
    let (_, r) = price_on(
        Some(cpu),
        wrapper.to_str().unwrap(),
        "",
        &[
            "--pairs",
            "4",
            "--decode-tokens",
            "2400",
            "--stall",
            "1",
            "--noise-windows",
            "2",
            "--warmup-windows",
            "0",
            "--windows",
            "1",
        ],
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    spinner.join().unwrap();
    assert_ne!(r["verdict"], "infra:worker_stalled", "{r}");
    let windows: Vec<&serde_json::Value> = r["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["phases"].as_array().unwrap())
        .filter(|ph| ph["role"] == "candidate")
        .flat_map(|ph| ph["windows"].as_array().unwrap())
        .collect();
    assert!(!windows.is_empty(), "{r}");
    // Every window ran on the CPU, as its tree shows; some waited beside the spinners.
    for w in &windows {
        let share = w["telemetry"]["worker_cpu_share"].as_f64().unwrap_or(0.0);
        assert!(share > 0.0, "a sandboxed window with no CPU seen: {w}");
        assert!(
            w["window_seconds"].as_f64().unwrap() > 1.0,
            "shorter than the guard: {w}"
        );
    }
    assert!(
        windows.iter().any(|w| w["disturbed"] == true),
        "no sandboxed window was seen disturbed beside a spinner on its core: {r}"
    );
}

/// The first CPU this process may run on.
fn first_allowed_cpu() -> usize {
    // SAFETY: a zeroed cpu_set_t is an empty set; the call fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    assert_eq!(unsafe { libc::sched_getaffinity(0, size, &mut set) }, 0);
    (0..libc::CPU_SETSIZE as usize)
        .find(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .expect("some CPU is allowed")
}

/// Confines the calling thread (and what it starts afterwards) to `cpu`.
fn pin_to(cpu: usize) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set, given one CPU before the call reads it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    unsafe { libc::CPU_SET(cpu, &mut set) };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    match unsafe { libc::sched_setaffinity(0, size, &set) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}
