//! `fastdecode price selftest`: a benchmark of the clock itself. It prices this build against
//! itself (a no-op: the true score is 1.0) and the fault build slowed by X % against this build
//! (`fastdecode-faulty`, `FASTDECODE_FAULT=slow=1+X/100`: every window sleeps X % of its own
//! time, so the true score is 1/(1+X/100)), N times each, alternating so both see the same
//! machine, optionally under a background CPU spinner, and reports how often the clock is wrong:
//! no-ops rejected (below the floor) or with an interval that excludes 1.0, slowdowns not
//! detected (1.0 not above the interval), and how precise and how quick a pricing is.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;

use fastdecode_clock::price::{self, PriceResult, Sides};
use fastdecode_clock::stats::median;

use crate::common::bar;
use crate::common::{parent_of_workers, this_binary, write_file, WorkerSide};
use crate::pricing::{check_side, PricingOpts};

#[derive(Args)]
pub struct SelftestArgs {
    /// No-op pricings, and pricings of the slowed build.
    #[arg(long, default_value_t = 20)]
    runs: usize,
    /// Pricings of the slowed build (default: --runs).
    #[arg(long)]
    slow_runs: Option<usize>,
    /// The slowed build's slowdown, in percent.
    #[arg(long, default_value_t = 3.0)]
    slowdown: f64,
    /// Run a background CPU spinner busy this fraction of the time, in [0, 1).
    #[arg(long)]
    load: Option<f64>,
    /// The fault build (default: `fastdecode-faulty` next to this binary; built by
    /// `cargo build --release --features fastdecode-cli/fault-injection`).
    #[arg(long)]
    faulty: Option<PathBuf>,
    #[command(flatten)]
    side: WorkerSide,
    #[command(flatten)]
    opts: PricingOpts,
    /// Output directory: every pricing's result and selftest.json.
    #[arg(long, default_value = "selftest-out")]
    out: PathBuf,
    /// Print the report JSON instead of the table.
    #[arg(long)]
    json: bool,
}

/// One pricing as the report counts it.
#[derive(Debug, Clone, Serialize)]
struct Run {
    seed: u64,
    verdict: String,
    score: Option<f64>,
    ci95: Option<[f64; 2]>,
    half_width: Option<f64>,
    pairs_used: usize,
    windows_per_phase: Option<usize>,
    stopping_reason: Option<String>,
    seconds: f64,
}

impl Run {
    fn of(seed: u64, r: &PriceResult, seconds: f64) -> Run {
        Run {
            seed,
            verdict: r.verdict.clone(),
            score: r.score,
            ci95: r.ci95,
            half_width: r.half_width,
            pairs_used: r.pairs_used,
            windows_per_phase: r.windows_per_phase,
            stopping_reason: r
                .stopping_reason
                .and_then(|s| serde_json::to_value(s).ok())
                .and_then(|v| v.as_str().map(String::from)),
            seconds,
        }
    }
}

/// Rates over one kind of pricing.
#[derive(Debug, Clone, Serialize)]
struct Summary {
    runs: usize,
    passed: usize,
    below_floor: usize,
    inconclusive: usize,
    /// Other `infra:` and `violation:` verdicts (no interval).
    other: usize,
    /// Runs whose interval lies wholly below 1.0 / wholly above it.
    ci_below_one: usize,
    ci_above_one: usize,
    median_half_width: Option<f64>,
    max_half_width: Option<f64>,
    median_score: Option<f64>,
    median_pairs: Option<f64>,
    median_seconds: Option<f64>,
    max_seconds: Option<f64>,
}

fn summarise(runs: &[Run]) -> Summary {
    let count = |f: &dyn Fn(&Run) -> bool| runs.iter().filter(|r| f(r)).count();
    let med = |f: &dyn Fn(&Run) -> Option<f64>| {
        let v: Vec<f64> = runs.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| median(&v))
    };
    let max = |f: &dyn Fn(&Run) -> Option<f64>| runs.iter().filter_map(f).reduce(f64::max);
    Summary {
        runs: runs.len(),
        passed: count(&|r| r.verdict == "passed"),
        below_floor: count(&|r| r.verdict == "below_floor"),
        inconclusive: count(&|r| r.verdict == "infra:inconclusive"),
        other: count(&|r| {
            !matches!(
                r.verdict.as_str(),
                "passed" | "below_floor" | "infra:inconclusive"
            )
        }),
        ci_below_one: count(&|r| r.ci95.is_some_and(|[_, hi]| hi < 1.0)),
        ci_above_one: count(&|r| r.ci95.is_some_and(|[lo, _]| lo > 1.0)),
        median_half_width: med(&|r| r.half_width),
        max_half_width: max(&|r| r.half_width),
        median_score: med(&|r| r.score),
        median_pairs: med(&|r| Some(r.pairs_used as f64)),
        median_seconds: med(&|r| Some(r.seconds)),
        max_seconds: max(&|r| Some(r.seconds)),
    }
}

/// Shares of the runs (`None` where there were no runs of that kind).
#[derive(Debug, Clone, Serialize)]
struct Rates {
    /// No-ops: rejected below the floor / interval excluding 1.0 / interval containing 1.0.
    noop_false_rejection_rate: Option<f64>,
    noop_ci_excludes_one_rate: Option<f64>,
    noop_ci_contains_one_rate: Option<f64>,
    /// Slowed build: 1.0 above the interval (the slowdown seen, on the right side).
    slow_detection_rate: Option<f64>,
    slow_wrong_side_rate: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
struct Report {
    commit: &'static str,
    command: String,
    cpus: usize,
    /// `/proc/loadavg` before the first and after the last pricing.
    loadavg_start: String,
    loadavg_end: String,
    model: String,
    weights_digest: String,
    slowdown_percent: f64,
    fault: String,
    load: Option<f64>,
    noop: Summary,
    slow: Summary,
    rates: Rates,
    noop_runs: Vec<Run>,
    slow_runs: Vec<Run>,
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// A background thread busy `duty` of every 20 ms until dropped: the injected CPU load.
struct Spinner {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Spinner {
    fn start(duty: f64) -> Spinner {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let period = Duration::from_millis(20);
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                while t0.elapsed() < period.mul_f64(duty) {
                    std::hint::spin_loop();
                }
                std::thread::sleep(period.mul_f64(1.0 - duty));
            }
        });
        Spinner {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub fn run(a: SelftestArgs) -> Result<()> {
    parent_of_workers();
    if a.runs == 0 {
        bail!("--runs 0: must be at least 1");
    }
    if !(a.slowdown.is_finite() && (0.0..1000.0).contains(&a.slowdown)) {
        bail!(
            "--slowdown {}: must be a percentage in [0, 1000)",
            a.slowdown
        );
    }
    if let Some(d) = a.load {
        if !(d.is_finite() && (0.0..1.0).contains(&d)) {
            bail!("--load {d}: must be a duty cycle in [0, 1)");
        }
    }
    check_side(&a.side)?;
    let model = a.side.model()?;
    let params = a.opts.params(&model)?;
    let mut inputs: Vec<(&str, &std::path::Path)> = vec![];
    if let Some(f) = &a.faulty {
        inputs.push(("--faulty build", f));
    }
    if let Some(dir) = model.dir() {
        inputs.push(("model directory", dir));
    }
    crate::common::outputs_apart(&[("--out", &a.out)], &inputs)?;
    let me = this_binary()?;
    let faulty = match &a.faulty {
        Some(f) => f.clone(),
        None => me
            .parent()
            .context("locating this binary's directory")?
            .join("fastdecode-faulty"),
    };
    if !faulty.is_file() {
        bail!(
            "--faulty {}: no such build (build it with `cargo build --release --features fastdecode-cli/fault-injection`)",
            faulty.display()
        );
    }
    let fault = format!("slow={}", 1.0 + a.slowdown / 100.0);
    // Workers inherit the environment: the fault build reads its fault from it, the real build
    // ignores it. Set once, here, before any thread of this process exists.
    std::env::set_var("FASTDECODE_FAULT", &fault);
    let none = Some(String::new());
    let spec = |bin: &PathBuf| a.side.spec(bin, &model, none.clone());
    let noop = Sides {
        baseline: spec(&me),
        candidate: spec(&me),
        noop: spec(&me),
    };
    let slow = Sides {
        baseline: spec(&me),
        candidate: spec(&faulty),
        noop: spec(&me),
    };
    let slow_n = a.slow_runs.unwrap_or(a.runs);
    let total = a.runs + slow_n;
    let loadavg_start = loadavg();
    let _spinner = a.load.filter(|&d| d > 0.0).map(Spinner::start);
    let pb = bar(total as u64, "selftest");
    let hidden = indicatif::ProgressBar::hidden();
    let (mut noop_runs, mut slow_runs) = (vec![], vec![]);
    for i in 0..a.runs.max(slow_n) {
        for (kind, sides, n, runs) in [
            ("noop", &noop, a.runs, &mut noop_runs),
            ("slow", &slow, slow_n, &mut slow_runs),
        ] {
            if i >= n {
                continue;
            }
            let mut p = params.clone();
            p.seed = params.seed + i as u64;
            pb.set_message(format!("{kind} {i}"));
            let t0 = Instant::now();
            let r = price::run(sides, &model, &p, &hidden)?;
            let run = Run::of(p.seed, &r, t0.elapsed().as_secs_f64());
            write_file(
                &a.out.join(format!("{kind}-{i}.json")),
                &(serde_json::to_string_pretty(&r)? + "\n"),
            )?;
            runs.push(run);
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    let (ns, ss) = (summarise(&noop_runs), summarise(&slow_runs));
    let rate = |k: usize, n: usize| (n > 0).then(|| k as f64 / n as f64);
    let rep = Report {
        commit: env!("FASTDECODE_GIT_COMMIT"),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg_start,
        loadavg_end: loadavg(),
        model: model.source.to_string(),
        weights_digest: model.digest.clone(),
        slowdown_percent: a.slowdown,
        fault,
        load: a.load,
        rates: Rates {
            noop_false_rejection_rate: rate(ns.below_floor, ns.runs),
            noop_ci_excludes_one_rate: rate(ns.ci_below_one + ns.ci_above_one, ns.runs),
            noop_ci_contains_one_rate: rate(
                ns.runs - ns.ci_below_one - ns.ci_above_one - ns.other,
                ns.runs,
            ),
            slow_detection_rate: rate(ss.ci_below_one, ss.runs),
            slow_wrong_side_rate: rate(ss.ci_above_one, ss.runs),
        },
        noop: ns,
        slow: ss,
        noop_runs,
        slow_runs,
    };
    let json = serde_json::to_string_pretty(&rep)? + "\n";
    write_file(&a.out.join("selftest.json"), &json)?;
    if a.json {
        out!("{json}")?;
        return Ok(());
    }
    let pct = |x: f64| format!("{:.1} %", 100.0 * x);
    let pct_or = |x: Option<f64>| x.map_or("-".into(), pct);
    let opt = |x: Option<f64>, f: &dyn Fn(f64) -> String| x.map_or("-".into(), f);
    for (name, s) in [("no-op", &rep.noop), ("slowed", &rep.slow)] {
        outln!(
            "{name:<7} {} runs: {} passed, {} below floor, {} inconclusive, {} other; CI below 1.0 in {}, above in {}; median half-width {}, median {} pairs, median {} per pricing",
            s.runs,
            s.passed,
            s.below_floor,
            s.inconclusive,
            s.other,
            s.ci_below_one,
            s.ci_above_one,
            opt(s.median_half_width, &|v| pct(v)),
            opt(s.median_pairs, &|v| format!("{v:.0}")),
            opt(s.median_seconds, &|v| format!("{v:.1} s")),
        )?;
    }
    let r = &rep.rates;
    outln!(
        "rates   no-op false rejections {}, no-op CI excluding 1.0 {}, {} slowdown detected {}",
        pct_or(r.noop_false_rejection_rate),
        pct_or(r.noop_ci_excludes_one_rate),
        pct(a.slowdown / 100.0),
        pct_or(r.slow_detection_rate)
    )?;
    outln!("written {}", a.out.join("selftest.json").display())?;
    Ok(())
}
