//! `fastdecode price`: paired pricing of a candidate build against the pinned baseline build,
//! exactly as the ranked runner does it (`crates/clock`); `fastdecode price selftest` prices
//! no-ops and slowed builds to measure the clock itself (`selftest.rs`).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use indicatif::ProgressBar;

use fastdecode_clock::baseline;
use fastdecode_clock::price::{self, Sides};

use crate::common::{bar, outputs_apart, parent_of_workers, this_binary, write_file, WorkerSide};
use crate::pricing::{check_side, PricingOpts};
use crate::selftest::{self, SelftestArgs};

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct PriceArgs {
    #[command(subcommand)]
    cmd: Option<PriceCmd>,
    /// The baseline build (a fastdecode binary).
    #[arg(
        long,
        conflicts_with = "baseline_ref",
        required_unless_present = "baseline_ref"
    )]
    baseline: Option<PathBuf>,
    /// Build the baseline from this git ref of --repo (cached by commit) and price against it.
    #[arg(long)]
    baseline_ref: Option<String>,
    /// Repository of --baseline-ref (default: the one containing the current directory).
    #[arg(long, default_value = ".")]
    repo: PathBuf,
    /// Cache of built baselines (default: $FASTDECODE_HOME/baselines or ~/.cache/fastdecode/baselines).
    #[arg(long)]
    cache: Option<PathBuf>,
    /// The build under test; this binary when omitted.
    #[arg(long)]
    candidate: Option<PathBuf>,
    /// The unmodified build that normalises the dflash track; the baseline when omitted.
    #[arg(long)]
    noop: Option<PathBuf>,
    /// Optimisation flags switched on in the candidate's workers.
    #[arg(long)]
    candidate_flags: Option<String>,
    #[command(flatten)]
    side: WorkerSide,
    #[command(flatten)]
    pub opts: PricingOpts,
    /// Output directory: result.json and pairs.svg.
    #[arg(long, default_value = "price-out")]
    out: PathBuf,
    /// Keep this file holding one line of the pricing's progress (pairs done of the budget, the
    /// interval so far, the time left), rewritten whole every second: what an arena runner
    /// shows a solver following the stage.
    #[arg(long, value_name = "FILE")]
    progress_file: Option<PathBuf>,
    /// Print the result JSON instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum PriceCmd {
    /// Measure the clock: price no-ops and a slowed build many times, report its error rates.
    Selftest(Box<SelftestArgs>),
}

fn cache_dir(a: &PriceArgs) -> PathBuf {
    if let Some(c) = &a.cache {
        return c.clone();
    }
    let root = std::env::var_os("FASTDECODE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/fastdecode")))
        .unwrap_or_else(|| std::env::temp_dir().join("fastdecode"));
    root.join("baselines")
}

/// `--progress-file`: a thread that rewrites the file with the bar's state every second while
/// the pricing runs (whole, under a temporary name then renamed, so a reader never sees half a
/// line), and once more when dropped.
struct Mirror {
    stop: std::sync::mpsc::Sender<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Mirror {
    fn start(pb: ProgressBar, path: PathBuf) -> Mirror {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let write = move || {
            let line = format!(
                "{} of at most {} pairs; {}\n",
                pb.position(),
                pb.length().unwrap_or(0),
                pb.message()
            );
            // A progress line is a convenience: a full disk must not stop the pricing.
            let _ = fastdecode_model::files::write_atomic(&path, line.as_bytes());
        };
        let thread = std::thread::spawn(move || {
            let tick = std::time::Duration::from_secs(1);
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(tick) {
                write();
            }
            write();
        });
        Mirror {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        let _ = self.stop.send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Refuses, before any pair runs, an --out that cannot become a directory (a file, or a path
/// under one): found only when the result is written, it would lose the whole pricing.
fn check_out_dir(out: &std::path::Path) -> Result<()> {
    if let Some(existing) = out.ancestors().find(|a| a.exists()) {
        if !existing.is_dir() {
            bail!(
                "--out {}: {} is not a directory",
                out.display(),
                existing.display()
            );
        }
    }
    Ok(())
}

pub fn run(a: PriceArgs) -> Result<()> {
    if let Some(PriceCmd::Selftest(s)) = a.cmd {
        return selftest::run(*s);
    }
    parent_of_workers();
    check_side(&a.side)?;
    let model = a.side.model()?;
    let params = a.opts.params(&model)?;
    let mut inputs: Vec<(&str, &std::path::Path)> = vec![];
    for (what, b) in [
        ("--baseline build", &a.baseline),
        ("--candidate build", &a.candidate),
        ("--noop build", &a.noop),
    ] {
        if let Some(b) = b {
            inputs.push((what, b));
        }
    }
    if let Some(dir) = model.dir() {
        inputs.push(("model directory", dir));
    }
    let mut outputs = vec![("--out", a.out.as_path())];
    if let Some(f) = &a.progress_file {
        outputs.push(("--progress-file", f.as_path()));
    }
    outputs_apart(&outputs, &inputs)?;
    check_out_dir(&a.out)?;
    let baseline_bin = match (&a.baseline, &a.baseline_ref) {
        (Some(b), _) => b.clone(),
        (None, Some(r)) => baseline::build(&a.repo, r, &cache_dir(&a), &|m| eprintln!("{m}"))?,
        (None, None) => bail!("give --baseline or --baseline-ref"),
    };
    for b in [Some(&baseline_bin), a.candidate.as_ref(), a.noop.as_ref()]
        .into_iter()
        .flatten()
    {
        if !b.is_file() {
            bail!("{}: no such build", b.display());
        }
    }
    let candidate_bin = match &a.candidate {
        Some(c) => c.clone(),
        None => this_binary()?,
    };
    let none = Some(String::new());
    let sides = Sides {
        baseline: a.side.spec(&baseline_bin, &model, none.clone()),
        candidate: a.side.spec(
            &candidate_bin,
            &model,
            Some(a.candidate_flags.clone().unwrap_or_default()),
        ),
        noop: a
            .side
            .spec(a.noop.as_ref().unwrap_or(&baseline_bin), &model, none),
    };
    let pb = bar(params.rule.max_pairs as u64, "price");
    let mirror = a
        .progress_file
        .as_ref()
        .map(|f| Mirror::start(pb.clone(), f.clone()));
    let res = price::run(&sides, &model, &params, &pb)?;
    drop(mirror);
    pb.finish_and_clear();
    let json = serde_json::to_string_pretty(&res)? + "\n";
    write_file(&a.out.join("result.json"), &json).context("writing the result")?;
    write_file(&a.out.join("pairs.svg"), &fastdecode_clock::plot::svg(&res))
        .context("writing the plot")?;
    if a.json {
        out!("{json}")?;
    } else {
        out!("{}", price::summary(&res))?;
        outln!("{:<22} {}", "written", a.out.display())?;
    }
    if !res.passed {
        bail!("price: {}", res.verdict);
    }
    Ok(())
}
