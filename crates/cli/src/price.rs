//! `fastdecode price`: paired pricing of a candidate build against the pinned baseline build,
//! exactly as the ranked runner does it (`crates/clock`).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use fastdecode_clock::baseline;
use fastdecode_clock::price::{self, PriceParams, Sides, Track};
use fastdecode_clock::telemetry::QuietParams;

use crate::common::{parent_of_workers, this_binary, write_file, WorkerSide};

#[derive(Args)]
pub struct PriceArgs {
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
    #[arg(long, default_value = "serial", value_parser = ["serial", "dflash"])]
    track: String,
    /// Accepted pairs wanted.
    #[arg(long, default_value_t = 10)]
    pairs: usize,
    #[command(flatten)]
    side: WorkerSide,
    /// Prompt (seed) tokens of the window.
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    /// Decode tokens of the window (default: 128 serial, 512 dflash).
    #[arg(long)]
    decode_tokens: Option<usize>,
    /// DFlash block size (dflash track).
    #[arg(long, default_value_t = 8)]
    block_size: usize,
    /// DFlash draft source (dflash track): `drafter` or `oracle:P`.
    #[arg(long, default_value = "drafter")]
    draft: String,
    /// Seed of prompts, oracle and bootstrap.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Reject when the whole 95 % interval of the score is below this.
    #[arg(long, default_value_t = 0.95)]
    floor: f64,
    #[arg(long, default_value_t = 2000)]
    bootstrap: usize,
    /// Quiet means at most this busy fraction of all CPUs before a phase.
    #[arg(long, default_value_t = 0.5)]
    quiet_cpu: f64,
    /// Quiet means GPU utilisation at most this (percent), when a GPU is present.
    #[arg(long, default_value_t = 5)]
    quiet_gpu_util: u32,
    /// Quiet means GPU temperature at most this (Celsius), when a GPU is present.
    #[arg(long, default_value_t = 60)]
    quiet_gpu_temp: u32,
    /// Seconds to wait for quiet before a phase (its pair is re-run when it never comes).
    #[arg(long, default_value_t = 5.0)]
    quiet_wait: f64,
    /// Stall guard: seconds without worker progress before it is killed.
    #[arg(long, default_value_t = 30.0)]
    stall: f64,
    /// A pair with a phase slower than this × its role's median is re-run.
    #[arg(long, default_value_t = 3.0)]
    outlier_factor: f64,
    /// Plausibility cap on any speed-up.
    #[arg(long, default_value_t = 100.0)]
    max_speedup: f64,
    /// Output directory: result.json and pairs.svg.
    #[arg(long, default_value = "price-out")]
    out: PathBuf,
    /// Print the result JSON instead of the table.
    #[arg(long)]
    json: bool,
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

pub fn run(a: PriceArgs) -> Result<()> {
    parent_of_workers();
    let track: Track = a.track.parse().map_err(anyhow::Error::msg)?;
    let model = a.side.model()?;
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
    let params = PriceParams {
        track,
        pairs: a.pairs,
        prompt_tokens: a.prompt_tokens,
        decode_tokens: a.decode_tokens.unwrap_or(match track {
            Track::Serial => 128,
            Track::Dflash => 512,
        }),
        block_size: a.block_size,
        draft: a.draft.clone(),
        seed: a.seed,
        floor: a.floor,
        resamples: a.bootstrap,
        quiet: QuietParams {
            max_cpu_busy: a.quiet_cpu,
            max_gpu_util_pct: a.quiet_gpu_util,
            max_gpu_temp_c: a.quiet_gpu_temp,
            max_wait_seconds: a.quiet_wait,
        },
        stall_seconds: a.stall,
        outlier_factor: a.outlier_factor,
        max_speedup: a.max_speedup,
        max_attempts: 2 * a.pairs,
    };
    let pb = ProgressBar::new(a.pairs as u64);
    pb.set_style(
        ProgressStyle::with_template("price [{bar:30}] {pos}/{len} pairs {msg}")
            .expect("static template")
            .progress_chars("=> "),
    );
    let res = price::run(&sides, &model, &params, &pb)?;
    pb.finish_and_clear();
    let json = serde_json::to_string_pretty(&res)? + "\n";
    write_file(&a.out.join("result.json"), &json).context("writing the result")?;
    write_file(&a.out.join("pairs.svg"), &fastdecode_clock::plot::svg(&res))
        .context("writing the plot")?;
    if a.json {
        print!("{json}");
    } else {
        print!("{}", price::summary(&res));
        println!("{:<22} {}", "written", a.out.display());
    }
    if !res.passed {
        bail!("price: {}", res.verdict);
    }
    Ok(())
}
