//! How a pricing is run, shared by `fastdecode price` and `fastdecode price selftest`: the clock's
//! options (track, stopping rule, windows, quiet machine), checked at the start with errors that
//! name the option, and turned into the clock's `PriceParams`.

use anyhow::{bail, Result};
use clap::Args;

use fastdecode_clock::price::{PriceParams, Track};
use fastdecode_clock::score::Rule;
use fastdecode_clock::telemetry::QuietParams;
use fastdecode_engine::DraftSpec;
use fastdecode_gate::check::{DEFAULT_BUDGET, DEFAULT_ENVELOPE};
use fastdecode_model::config::{DrafterConfig, MAX_BLOCK_SIZE};
use fastdecode_worker::ModelId;

use crate::common::{non_negative_f32, per_1000, WorkerSide};

/// The options of a pricing.
#[derive(Args, Clone)]
pub struct PricingOpts {
    #[arg(long, default_value = "serial", value_parser = ["serial", "dflash"])]
    track: String,
    /// Add pairs until the 95 % interval's half-width, relative to the score, is at most this
    /// (default 0.01 unless --pairs is given).
    #[arg(long, conflicts_with = "pairs")]
    target_ci: Option<f64>,
    /// Run exactly this many accepted pairs instead of aiming at a precision (more only if
    /// --max-pairs allows them while the interval straddles the floor).
    #[arg(long)]
    pairs: Option<usize>,
    /// Pairs always run before the interval is first looked at (with --target-ci).
    #[arg(long, default_value_t = 10, conflicts_with = "pairs")]
    min_pairs: usize,
    /// The pair budget (default: 100 with a target, --pairs without).
    #[arg(long)]
    max_pairs: Option<usize>,
    /// Seconds after which no more pairs are added (the first pairs always run).
    #[arg(long, default_value_t = 600.0)]
    time_budget: f64,
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
    /// Seed of prompts, prompt order and oracle.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Reject when the whole 95 % interval of the score is below this.
    #[arg(long, default_value_t = 0.95)]
    floor: f64,
    /// Identical windows timed in one warm baseline worker to measure the noise.
    #[arg(long, default_value_t = 16)]
    noise_windows: usize,
    /// Unscored windows at the start of every phase.
    #[arg(long, default_value_t = 2)]
    warmup_windows: usize,
    /// Scored windows per phase (default: sized from the measured noise).
    #[arg(long)]
    windows: Option<usize>,
    /// Quiet means at most this busy fraction of all CPUs before a phase.
    #[arg(long, default_value_t = 0.5)]
    quiet_cpu: f64,
    /// Quiet means GPU utilisation at most this (percent), when a GPU is present.
    #[arg(long, default_value_t = 5)]
    quiet_gpu_util: u32,
    /// Quiet means GPU temperature at most this (Celsius), when a GPU is present.
    #[arg(long, default_value_t = 60)]
    quiet_gpu_temp: u32,
    /// Seconds to wait for quiet before a phase.
    #[arg(long, default_value_t = 0.5)]
    quiet_wait: f64,
    /// Re-run a pair whose phase found the machine never quiet (by default such a phase is
    /// recorded and kept: its windows' minimum and the interval carry the noise).
    #[arg(long)]
    require_quiet: bool,
    /// Stall guard: seconds without worker progress before it is killed.
    #[arg(long, default_value_t = 30.0)]
    stall: f64,
    /// A pair with a phase whose best window is slower than this × its role's median is re-run.
    #[arg(long, default_value_t = 3.0)]
    outlier_factor: f64,
    /// Plausibility cap on any speed-up.
    #[arg(long, default_value_t = 100.0)]
    max_speedup: f64,
    /// Near-tie envelope by which a candidate's timed output that differs from the baseline's
    /// is judged (the gate's rule: reference top-1 logit minus the emitted token's logit).
    #[arg(long, allow_negative_numbers = true, default_value_t = DEFAULT_ENVELOPE, value_parser = non_negative_f32)]
    envelope: f32,
    /// Near-ties allowed per 1000 of the candidate's distinct timed tokens (0 to 1000).
    #[arg(long, allow_negative_numbers = true, default_value_t = DEFAULT_BUDGET, value_parser = per_1000)]
    budget: f64,
}

/// An option's value checked at the start, with an error that names the option.
fn check(ok: bool, option: &str, why: &str, value: impl std::fmt::Display) -> Result<()> {
    if !ok {
        bail!("{option} {value}: {why}");
    }
    Ok(())
}

impl PricingOpts {
    /// The track and the pricing parameters, every option checked before any worker starts.
    pub fn params(&self, model: &ModelId) -> Result<PriceParams> {
        let track: Track = self.track.parse().map_err(anyhow::Error::msg)?;
        let rule = self.stopping_rule()?;
        let decode_tokens = self.window(track, model)?;
        self.check_draft(track, model)?;
        self.check_windows()?;
        self.check_guards()?;
        Ok(self.price_params(track, rule, decode_tokens))
    }

    /// When pairs stop being added: the floor, the time budget, and a precision aimed at
    /// (--target-ci, --min-pairs) or a number of pairs (--pairs), within --max-pairs.
    fn stopping_rule(&self) -> Result<Rule> {
        check(
            self.floor.is_finite() && self.floor > 0.0,
            "--floor",
            "must be a positive number",
            self.floor,
        )?;
        check(
            self.time_budget.is_finite() && self.time_budget > 0.0,
            "--time-budget",
            "must be a positive number of seconds",
            self.time_budget,
        )?;
        if let Some(h) = self.target_ci {
            check(
                h.is_finite() && h > 0.0 && h < 1.0,
                "--target-ci",
                "must be a relative half-width in (0, 1), e.g. 0.01",
                h,
            )?;
        }
        Ok(match self.pairs {
            Some(n) => {
                check(
                    n >= 4,
                    "--pairs",
                    "a confidence interval needs at least 4",
                    n,
                )?;
                let max = self.max_pairs.unwrap_or(n);
                check(max >= n, "--max-pairs", "is below --pairs", max)?;
                Rule {
                    min_pairs: n,
                    max_pairs: max,
                    target_half_width: None,
                    floor: self.floor,
                }
            }
            None => {
                check(
                    self.min_pairs >= 4,
                    "--min-pairs",
                    "a confidence interval needs at least 4",
                    self.min_pairs,
                )?;
                let max = self.max_pairs.unwrap_or(100.max(self.min_pairs));
                check(
                    max >= self.min_pairs,
                    "--max-pairs",
                    "is below --min-pairs",
                    max,
                )?;
                Rule {
                    min_pairs: self.min_pairs,
                    max_pairs: max,
                    target_half_width: Some(self.target_ci.unwrap_or(0.01)),
                    floor: self.floor,
                }
            }
        })
    }

    /// The window's decode tokens (the track's default unless given), checked with the prompt
    /// tokens to fit the model.
    fn window(&self, track: Track, model: &ModelId) -> Result<usize> {
        check(
            self.prompt_tokens >= 1,
            "--prompt-tokens",
            "must be at least 1",
            self.prompt_tokens,
        )?;
        let decode_tokens = self.decode_tokens.unwrap_or(match track {
            Track::Serial => 128,
            Track::Dflash => 512,
        });
        check(
            decode_tokens >= 1,
            "--decode-tokens",
            "must be at least 1",
            decode_tokens,
        )?;
        // A window the model cannot hold would fail in its first worker, after the setup.
        if self.prompt_tokens.saturating_add(decode_tokens) > model.max_positions {
            bail!(
                "--prompt-tokens {} and --decode-tokens {decode_tokens}: more than the model's \
                 max_position_embeddings {}",
                self.prompt_tokens,
                model.max_positions
            );
        }
        Ok(decode_tokens)
    }

    /// --draft parsed, and on the dflash track --block-size within what the draft source takes.
    fn check_draft(&self, track: Track, model: &ModelId) -> Result<()> {
        let draft: DraftSpec = self
            .draft
            .parse()
            .map_err(|e: String| anyhow::anyhow!("--draft {}: {e}", self.draft))?;
        if track != Track::Dflash {
            return Ok(());
        }
        let max = match draft {
            DraftSpec::Drafter => MAX_BLOCK_SIZE.min(drafter_block_size(model)?),
            DraftSpec::Oracle(_) => MAX_BLOCK_SIZE,
        };
        check(
            (2..=max).contains(&self.block_size),
            "--block-size",
            &format!("the dflash track needs 2 to {max} with --draft {draft}"),
            self.block_size,
        )
    }

    /// The counts of windows: of the noise measurement, of warm-up and of a phase.
    fn check_windows(&self) -> Result<()> {
        check(
            self.noise_windows >= 2,
            "--noise-windows",
            "must be at least 2",
            self.noise_windows,
        )?;
        check(
            self.warmup_windows <= 64,
            "--warmup-windows",
            "must be at most 64",
            self.warmup_windows,
        )?;
        if let Some(k) = self.windows {
            check((1..=256).contains(&k), "--windows", "must be 1 to 256", k)?;
        }
        Ok(())
    }

    /// The guards of a pricing: the quiet machine, the stall, the outlier and speed-up caps.
    fn check_guards(&self) -> Result<()> {
        // A fraction, not a percentage (as --quiet-gpu-util is): 50 would never wait at all.
        // Below 0 no machine is ever quiet (the tests' way to price a machine that never is).
        check(
            self.quiet_cpu.is_finite() && self.quiet_cpu <= 1.0,
            "--quiet-cpu",
            "must be a busy fraction of all CPUs, at most 1",
            self.quiet_cpu,
        )?;
        check(
            self.quiet_wait.is_finite() && self.quiet_wait >= 0.0,
            "--quiet-wait",
            "must be a non-negative number of seconds",
            self.quiet_wait,
        )?;
        check(
            self.stall.is_finite() && self.stall > 0.0,
            "--stall",
            "must be a positive number of seconds",
            self.stall,
        )?;
        check(
            self.outlier_factor.is_finite() && self.outlier_factor > 1.0,
            "--outlier-factor",
            "must be a number above 1",
            self.outlier_factor,
        )?;
        check(
            self.max_speedup.is_finite() && self.max_speedup > 1.0,
            "--max-speedup",
            "must be a number above 1",
            self.max_speedup,
        )
    }

    /// The clock's parameters from the checked options.
    fn price_params(&self, track: Track, rule: Rule, decode_tokens: usize) -> PriceParams {
        PriceParams {
            track,
            rule,
            time_budget_seconds: self.time_budget,
            prompt_tokens: self.prompt_tokens,
            decode_tokens,
            block_size: self.block_size,
            draft: self.draft.clone(),
            seed: self.seed,
            quiet: QuietParams {
                max_cpu_busy: self.quiet_cpu,
                max_gpu_util_pct: self.quiet_gpu_util,
                max_gpu_temp_c: self.quiet_gpu_temp,
                max_wait_seconds: self.quiet_wait,
            },
            require_quiet: self.require_quiet,
            stall_seconds: self.stall,
            outlier_factor: self.outlier_factor,
            max_speedup: self.max_speedup,
            envelope: self.envelope,
            budget_per_1000: self.budget,
            max_attempts: 2 * rule.max_pairs,
            noise_windows: self.noise_windows,
            warmup_windows: self.warmup_windows,
            windows: self.windows,
        }
    }
}

/// The block size of the drafter that `--draft drafter` drafts with: the model directory's
/// drafter/ (which must be there), or the synthetic preset's.
fn drafter_block_size(model: &ModelId) -> Result<usize> {
    Ok(match model.dir() {
        Some(dir) => {
            let cfg = dir.join("drafter/config.json");
            if !cfg.is_file() {
                bail!(
                    "--draft drafter: {} has no drafter/ (use --draft oracle:P)",
                    dir.display()
                );
            }
            DrafterConfig::from_file(&cfg)?.block_size
        }
        // Synthetic weights come with the preset's drafter.
        None => match &model.source {
            fastdecode_worker::ModelSource::Synthetic { preset, .. } => {
                fastdecode_model::synth::preset(preset)?.drafter.block_size
            }
            fastdecode_worker::ModelSource::Dir(_) => MAX_BLOCK_SIZE,
        },
    })
}

/// The worker timeouts, checked (a non-finite or negative one would not make a `Duration`).
pub fn check_side(side: &WorkerSide) -> Result<()> {
    for (option, v) in [
        ("--timeout", side.timeout),
        ("--ready-timeout", side.ready_timeout),
    ] {
        check(
            v.is_finite() && v > 0.0,
            option,
            "must be a positive number of seconds",
            v,
        )?;
    }
    Ok(())
}
