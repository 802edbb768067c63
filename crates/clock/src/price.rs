//! Paired pricing. A pricing first measures the machine's noise (identical windows in one warm
//! baseline worker, never scored) and sizes each phase's windows from it (`noise`). Then it adds
//! pairs: each pair times the baseline and the candidate (on the DFlash track the no-op and the
//! candidate, both drafting), each in a fresh worker process, one phase each, the order
//! alternating from pair to pair. A
//! phase runs a few unscored warm-up windows, then its scored windows, every window on a
//! different prompt of the pool (so no worker ever runs the same forward twice, and a build that
//! caches outputs across calls gains nothing); the two sides of a pair see the same prompts in
//! the same order. The parent times only the windows, checks the machine is quiet before each
//! phase and samples it during every window.
//!
//! Everything priced is a whole window as the parent sees it: from writing the request to
//! reading the last reply (the worker's `seeded` line is its own choice of when to speak, so it
//! is recorded, never priced). The DFlash track's oracle drafts are realised here from the
//! baseline's serial tokens and sent as drafts: the candidate never receives the truth.
//!
//! Each phase's figure is the minimum over its scored windows (`noise`: under one-sided noise the
//! minimum converges to the build's undisturbed time); a phase none of whose windows ran without
//! waiting on a run queue is re-run; the score is the ratio of the pairs' mean
//! figures (`score`), with a jackknife-t 95 % interval over pairs in Stein's two-stage form (`stats`). Pairs are added until the
//! interval's half-width reaches the target, clear of the floor, or a budget ends (`score::Rule`);
//! the verdict is below the floor only when the whole interval is, and `infra:inconclusive` when
//! the budget ends with the interval straddling it.
//!
//! A rejection must be the build's, not the machine's: every window's run-queue wait that the
//! worker's own process tree cannot have caused (time its busiest thread was ready to run while
//! another process had the CPU, `telemetry::excused_wait`) is also taken out of it, and the score
//! of those figures ("without waits") is computed beside the priced one. It is never a score (a
//! build could move time into waits), only a check: a wall-clock interval below the floor stands
//! as `below_floor` only when the interval without waits is below it too; else the slowdown was
//! waiting for another process's CPU, and the verdict is `infra:inconclusive`. Waits a build
//! makes itself (its own threads, more of them ready than there are CPUs, keeping its busiest
//! one waiting) are its own time: they are not excused, and its rejection stands.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use fastdecode_gate::check::{self, Counts};
use fastdecode_worker::protocol::WindowRequest;
use fastdecode_worker::{Build, Fault, ModelId, NoTick, Spec, TimedWindow, Worker};

use crate::noise::{self, Figures, NoiseReport};
use crate::score::{self, Interval, PairFigures, Rule, Stop};
use crate::stats::median;
use crate::telemetry::{
    quiesce, runqueue_wait_seconds, Machine, QuietCheck, QuietParams, Sampler, Telemetry,
    WindowTelemetry,
};

pub use crate::score::Track;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Baseline,
    Candidate,
    Noop,
}

/// What a window counts as disturbed by, without a precision target: half a percent.
pub const DEFAULT_TOLERANCE: f64 = 0.005;

/// A pair with a phase that had no undisturbed window is re-run, unless this many pairs in a row
/// were: then the machine is busy through whole phases, waiting longer would only spend the
/// budget, and the pair is kept with each phase's minimum over all its windows (the interval
/// carries the noise).
pub const KEEP_AFTER_DISTURBED: usize = 3;

#[derive(Debug, Clone)]
pub struct PriceParams {
    pub track: Track,
    /// Pairs, precision target, budget and floor.
    pub rule: Rule,
    /// Seconds after which no more pairs are added (the first `rule.min_pairs` always run).
    pub time_budget_seconds: f64,
    pub prompt_tokens: usize,
    pub decode_tokens: usize,
    /// DFlash track: block size and draft source of the candidate's and no-op's windows.
    pub block_size: usize,
    pub draft: String,
    pub seed: u64,
    pub quiet: QuietParams,
    /// A phase that started on a machine that never quieted voids its pair (else it is recorded
    /// and kept: the minimum and the interval carry the noise).
    pub require_quiet: bool,
    /// The stall guard: a worker with no progress for this long is killed (infra).
    pub stall_seconds: f64,
    /// A pair whose phase's best window took more than this many times its role's median is
    /// not accepted (a stall of the machine, not of the build).
    pub outlier_factor: f64,
    /// Plausibility cap: a speed-up above this is a violation, not a score.
    pub max_speedup: f64,
    /// Pair attempts allowed in all (re-runs of unaccepted pairs included).
    pub max_attempts: usize,
    /// Identical windows of the noise measurement.
    pub noise_windows: usize,
    /// Unscored windows at the start of every phase (a fresh process's first windows are slow).
    pub warmup_windows: usize,
    /// Scored windows per phase; `None`: sized from the noise.
    pub windows: Option<usize>,
    /// The gate's near-tie envelope and budget, by which a candidate's timed output that differs
    /// from the baseline's is judged (`timed_fidelity`).
    pub envelope: f32,
    pub budget_per_1000: f64,
}

pub struct Sides {
    pub baseline: Spec,
    pub candidate: Spec,
    /// The unmodified build that normalises the DFlash track (usually the baseline binary).
    pub noop: Spec,
}

#[derive(Debug, Clone, Serialize)]
pub struct WindowRecord {
    /// Index into the pool of prompts.
    pub prompt: usize,
    /// Warm-up windows are timed for the record but never scored.
    pub warmup: bool,
    /// The worker waited on a run queue for more than the tolerance of this window: not scored.
    pub disturbed: bool,
    /// Request written → last reply read: what is priced.
    pub window_seconds: f64,
    /// Request written → the worker's `seeded` line read: when the worker chose to say its
    /// prefill was done. For the record only; never priced.
    pub seeded_seconds: f64,
    pub tokens_match_baseline: Option<bool>,
    pub telemetry: WindowTelemetry,
}

#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    pub role: Role,
    pub quiet: QuietCheck,
    /// Spawn to `ready` (never timed as part of a window).
    pub spawn_seconds: f64,
    /// Scored windows that were not disturbed (none: the pair is re-run).
    pub undisturbed_windows: usize,
    /// Best scored window (the robust statistic the score uses, `noise::robust`) and the mean,
    /// for the record: mean / min − 1 is this phase's own noise.
    pub min_window_seconds: f64,
    pub mean_window_seconds: f64,
    pub tokens_match_baseline: Option<bool>,
    pub windows: Vec<WindowRecord>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Pair {
    pub attempt: usize,
    pub candidate_first: bool,
    /// The pool's prompts in the order every phase of this pair ran them (warm-up first).
    pub prompt_order: Vec<usize>,
    pub phases: Vec<Phase>,
    pub accepted: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejected_because: Option<String>,
    /// This pair's own score (robust statistic), and from the window means.
    pub score: Option<f64>,
    pub mean_score: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SideInfo {
    pub bin: PathBuf,
    pub build: Option<Build>,
    pub flags: Vec<String>,
}

/// The score as the window means would give it (the single-window clock's statistic), recorded
/// beside the robust one so the two can be compared run by run.
#[derive(Debug, Clone, Serialize)]
pub struct MeanStatistic {
    pub score: f64,
    pub ci95: [f64; 2],
    pub half_width: f64,
    pub baseline_seconds_per_token: f64,
    pub candidate_seconds_per_token: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct PriceResult {
    /// `passed`, `below_floor`, `infra:...` (`infra:inconclusive`: the interval still straddles
    /// the floor when the budget ends) or `violation:...`.
    pub verdict: String,
    pub passed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Whose process a failure came from: the candidate's, or the trusted builds' (the
    /// baseline's and the no-op's, the runner's trouble).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub culprit: Option<Role>,
    pub track: Track,
    /// The ratio of the pairs' mean robust window seconds (`score`); `ratio_of_means` is the
    /// same number under the original's name.
    pub score: Option<f64>,
    pub ci95: Option<[f64; 2]>,
    /// Relative half-width of `ci95`.
    pub half_width: Option<f64>,
    pub ci_method: &'static str,
    pub robust_statistic: &'static str,
    pub floor: f64,
    pub target_ci: Option<f64>,
    pub min_pairs: usize,
    pub max_pairs: usize,
    pub time_budget_seconds: f64,
    pub stopping_reason: Option<Stop>,
    pub pairs_used: usize,
    pub accepted_pair_count: usize,
    pub attempted_pair_count: usize,
    pub elapsed_seconds: f64,
    pub ratio_of_means: Option<f64>,
    pub raw_ratio_of_means: Option<f64>,
    pub noop_reference: Option<f64>,
    /// Median and minimum of the pairs' own scores.
    pub median: Option<f64>,
    pub min: Option<f64>,
    /// The pairs' mean robust window over the tokens it emits (1 + decode tokens): the window's
    /// whole time, prefill included, per emitted token.
    pub baseline_seconds_per_token: Option<f64>,
    pub candidate_seconds_per_token: Option<f64>,
    pub noop_seconds_per_token: Option<f64>,
    pub mean_statistic: Option<MeanStatistic>,
    /// The score and interval of each phase's best window with its run-queue wait taken out:
    /// never priced, only what a rejection is checked against (`WithoutWaits`).
    pub without_waits: Option<WithoutWaits>,
    pub noise: Option<NoiseReport>,
    pub warmup_windows: usize,
    pub windows_per_phase: Option<usize>,
    pub pairs_with_output_mismatch: usize,
    /// The candidate's distinct timed outputs judged by the reference (the gate's fidelity
    /// rule): one that matches the baseline's counts its tokens as exact.
    pub timed_fidelity: TimedFidelity,
    pub spent: Spent,
    pub weights_digest: String,
    pub gpu_telemetry: bool,
    /// The machine that priced (CPU model, GPUs, the candidate's backend).
    pub machine: Machine,
    pub prompt_tokens: usize,
    pub decode_tokens: usize,
    pub block_size: usize,
    pub draft: String,
    pub baseline: SideInfo,
    pub candidate: SideInfo,
    pub noop: Option<SideInfo>,
    pub pairs: Vec<Pair>,
}

impl PriceResult {
    /// A pricing's result before anything is measured: what it was asked to do.
    fn new(
        p: &PriceParams,
        model: &ModelId,
        sides: &Sides,
        has_gpu: bool,
        machine: Machine,
    ) -> PriceResult {
        let (r, dflash) = (&p.rule, p.track == Track::Dflash);
        PriceResult {
            verdict: String::new(),
            passed: false,
            detail: None,
            culprit: None,
            track: p.track,
            score: None,
            ci95: None,
            half_width: None,
            ci_method: "jackknife-t over pairs on the log score, Stein two-stage (variance of the first min_pairs pairs, their degrees of freedom) when wider",
            robust_statistic: "per phase, the minimum over its scored windows of the whole window (request written to last reply read)",
            floor: r.floor,
            target_ci: r.target_half_width,
            min_pairs: r.min_pairs,
            max_pairs: r.max_pairs,
            time_budget_seconds: p.time_budget_seconds,
            stopping_reason: None,
            pairs_used: 0,
            accepted_pair_count: 0,
            attempted_pair_count: 0,
            elapsed_seconds: 0.0,
            ratio_of_means: None,
            raw_ratio_of_means: None,
            noop_reference: None,
            median: None,
            min: None,
            baseline_seconds_per_token: None,
            candidate_seconds_per_token: None,
            noop_seconds_per_token: None,
            mean_statistic: None,
            without_waits: None,
            noise: None,
            warmup_windows: p.warmup_windows,
            windows_per_phase: None,
            pairs_with_output_mismatch: 0,
            timed_fidelity: TimedFidelity::default(),
            spent: Spent::default(),
            weights_digest: model.digest.clone(),
            gpu_telemetry: has_gpu,
            machine,
            prompt_tokens: p.prompt_tokens,
            decode_tokens: p.decode_tokens,
            block_size: if dflash { p.block_size } else { 1 },
            draft: if dflash { p.draft.clone() } else { String::new() },
            baseline: side(&sides.baseline, None),
            candidate: side(&sides.candidate, None),
            noop: dflash.then(|| side(&sides.noop, None)),
            pairs: vec![],
        }
    }
}

/// The score as it would be without the time the workers waited on a run queue for other
/// processes: per phase, the minimum over its scored windows of the window less its worker's
/// excused wait (`telemetry::excused_wait`). Under a load that lands on one side's workers more
/// than the other's (the scheduler's placement, not the build) the wall-clock score falls while
/// this one does not; a build that is slower in what it runs (or sleeps), or in waits its own
/// threads cause, is slower here too. Absent where the kernel keeps no schedstat.
#[derive(Debug, Clone, Serialize)]
pub struct WithoutWaits {
    pub score: f64,
    pub ci95: [f64; 2],
    /// Whether it overruled a rejection: the wall-clock interval was below the floor, this one
    /// was not.
    pub overruled_rejection: bool,
}

/// Where a pricing's time went, in seconds: the noise measurement and the baseline's tokens of
/// the pool (one worker), the phases' worker start-ups, their windows (warm-up included), the
/// waits for a quiet machine, and the reference judging differing timed outputs.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Spent {
    pub noise_and_pool: f64,
    pub start_ups: f64,
    pub windows: f64,
    pub quiet_waits: f64,
    pub judging: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct TimedFidelity {
    /// Distinct (prompt, output) windows of the candidate, and those that differed from the
    /// baseline's output and were judged by a live reference.
    pub windows: usize,
    pub judged_windows: usize,
    pub tokens: Counts,
    pub near_ties_allowed: usize,
}

/// The timed windows' judge. The gate's goldens have their own shapes (prompt and output
/// lengths, positions), so a build that behaves differently only on the timed window's shapes
/// (a cheaper attention past the goldens' lengths, say) passes the gate; its timed output then
/// differs from the baseline's. Differing is not wrong in itself (an honest reassociation can
/// take a near-tie), so every distinct differing output is judged once, on the candidate's own
/// chain, by a live process of the baseline with the gate's rule and envelope, and the near-ties
/// count against the gate's budget over all the candidate's distinct timed tokens.
#[derive(Default)]
struct Judge {
    seen: HashSet<(usize, Vec<u32>)>,
    pending: Vec<(usize, Vec<u32>)>,
    report: TimedFidelity,
}

impl Judge {
    /// Notes one candidate window; a new differing output waits for `judge`.
    fn note(&mut self, prompt: usize, tokens: &[u32], baseline: &[u32]) {
        if self.seen.insert((prompt, tokens.to_vec())) {
            self.report.windows += 1;
            if tokens == baseline {
                self.report.tokens.exact += tokens.len();
            } else {
                self.pending.push((prompt, tokens.to_vec()));
            }
        }
    }

    /// Judges the pending outputs in one reference worker: `Ok(Some(detail))` names the first
    /// token outside the envelope (never a token or a logit).
    fn judge(
        &mut self,
        reference: &Spec,
        model: &ModelId,
        pool: &[Vec<u32>],
        envelope: f32,
    ) -> Result<Option<String>, Fault> {
        if self.pending.is_empty() {
            return Ok(None);
        }
        let mut w = Worker::spawn(&drafting(reference, false), model.vocab, &model.digest)?;
        for (prompt, tokens) in std::mem::take(&mut self.pending) {
            let judged = w.replay(&pool[prompt], &tokens, true)?;
            let (c, diverged) = check::fidelity(&judged, &tokens, envelope);
            self.report.judged_windows += 1;
            self.report.tokens.add(c);
            if let Some(step) = diverged {
                w.shutdown();
                return Ok(Some(format!(
                    "the candidate's timed output on prompt {prompt} of the pool left the reference's envelope ({envelope}) at step {step}: a build that behaves differently on the timed window than on the gate's goldens"
                )));
            }
        }
        w.shutdown();
        Ok(None)
    }
}

/// `count` distinct random prompts of `len` tokens from `seed`.
fn prompts(seed: u64, count: usize, len: usize, vocab: usize) -> Result<Vec<Vec<u32>>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut seen = HashSet::new();
    let mut out = vec![];
    let mut tries = 0;
    while out.len() < count {
        let p: Vec<u32> = (0..len)
            .map(|_| rng.random_range(0..vocab as u32))
            .collect();
        tries += 1;
        anyhow::ensure!(
            tries <= 100 * count,
            "cannot draw {count} distinct prompts of {len} tokens from a vocabulary of {vocab}"
        );
        if seen.insert(p.clone()) {
            out.push(p);
        }
    }
    Ok(out)
}

fn side(spec: &Spec, build: Option<Build>) -> SideInfo {
    SideInfo {
        bin: spec.bin.clone(),
        build,
        flags: spec
            .flags
            .as_deref()
            .map(|f| {
                f.split(',')
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// `spec` for a worker whose windows draft with the model's drafter only when `drafter`.
fn drafting(spec: &Spec, drafter: bool) -> Spec {
    Spec {
        drafter: spec.drafter && drafter,
        ..spec.clone()
    }
}

/// A window as the parent saw it: request written → last reply read.
fn whole(t: &TimedWindow) -> f64 {
    t.prefill_seconds + t.decode_seconds
}

/// Prices `sides.candidate` against the baseline (on the DFlash track, against the no-op): the
/// parameters checked, the noise measured and the pool calibrated, pairs until the stopping
/// rule ends them, then the verdict.
pub fn run(
    sides: &Sides,
    model: &ModelId,
    p: &PriceParams,
    progress: &indicatif::ProgressBar,
) -> Result<PriceResult> {
    check_params(p)?;
    let start = Instant::now();
    let telemetry = Telemetry::new();
    let mut res = PriceResult::new(
        p,
        model,
        sides,
        telemetry.has_gpu(),
        Machine::here(&telemetry),
    );
    // The noise measurement and the calibration, in one baseline worker, never scored.
    progress.set_message("measuring noise");
    let tolerance = p
        .rule
        .target_half_width
        .map_or(DEFAULT_TOLERANCE, |h| h / 2.0);
    let calibration = match calibrate(&sides.baseline, model, p, tolerance, &mut res)? {
        Ok(c) => c,
        Err(f) => {
            end_with_fault(&mut res, f, Role::Baseline, start);
            return Ok(res);
        }
    };
    res.spent.noise_and_pool = start.elapsed().as_secs_f64();
    let inputs = PhaseInputs {
        p,
        model,
        telemetry: &telemetry,
        pool: &calibration.pool,
        truth: &calibration.truth,
        tolerance,
    };
    let mut pricing = Pricing::new(sides, inputs, progress, start, calibration.pool_serial, res);
    progress.set_length(p.rule.max_pairs as u64);
    let stop = loop {
        if pricing.attempts >= p.max_attempts {
            break Stop::AttemptBudget;
        }
        if let PairEnd::PricingOver = pricing.pair()? {
            return Ok(pricing.res);
        }
        if let Some(stop) = pricing.stopping() {
            break stop;
        }
    };
    Ok(pricing.finish(stop))
}

/// What a pricing must be asked for before anything runs.
fn check_params(p: &PriceParams) -> Result<()> {
    let r = &p.rule;
    anyhow::ensure!(
        r.min_pairs >= 4 && r.max_pairs >= r.min_pairs,
        "at least 4 pairs for a confidence interval, and a pair budget no smaller"
    );
    anyhow::ensure!(
        p.prompt_tokens >= 1 && p.decode_tokens >= 1,
        "the window needs at least one prompt and one decode token"
    );
    anyhow::ensure!(
        p.track == Track::Serial || p.block_size >= 2,
        "the dflash track needs --block-size of at least 2"
    );
    anyhow::ensure!(
        p.noise_windows >= 2,
        "the noise measurement needs 2 windows"
    );
    Ok(())
}

/// Ends a pricing on a worker's fault, blamed on the side whose worker it was.
fn end_with_fault(res: &mut PriceResult, f: Fault, culprit: Role, start: Instant) {
    res.verdict = f.category();
    res.detail = Some(f.to_string());
    res.culprit = Some(culprit);
    res.elapsed_seconds = start.elapsed().as_secs_f64();
}

/// How a pair attempt ended: recorded (accepted or not), or the pricing is over with its verdict
/// written (a worker's fault, or a timed output outside the envelope).
enum PairEnd {
    Recorded,
    PricingOver,
}

/// A pricing's pairs under way, from the calibration to the verdict.
struct Pricing<'a> {
    sides: &'a Sides,
    inputs: PhaseInputs<'a>,
    progress: &'a indicatif::ProgressBar,
    start: Instant,
    /// The first role runs first in a pair that is not `candidate_first`.
    roles: Vec<Role>,
    /// The baseline's serial figures of the pool (robust, mean): its side of the pairs on the
    /// DFlash track, which time no baseline phase.
    pool_serial: (Figures, Figures),
    /// Each role's expected window (the noise's median, then the role's last window), against
    /// which its next window is sampled for stalls.
    expected: HashMap<Role, Duration>,
    judge: Judge,
    /// The accepted pairs' figures: the phases' minima (what the score uses) and their means.
    robust_pairs: Vec<PairFigures>,
    mean_pairs: Vec<PairFigures>,
    /// The accepted pairs' figures without run-queue waits, while every pair has them.
    waitless_pairs: Option<Vec<PairFigures>>,
    /// The interval over the accepted pairs, once there are `min_pairs` of them.
    last: Option<Interval>,
    /// Pair attempts so far (re-runs of unaccepted pairs included).
    attempts: usize,
    /// Consecutive pairs with a phase that had no undisturbed window.
    busy_streak: usize,
    res: PriceResult,
}

impl<'a> Pricing<'a> {
    fn new(
        sides: &'a Sides,
        inputs: PhaseInputs<'a>,
        progress: &'a indicatif::ProgressBar,
        start: Instant,
        pool_serial: (Figures, Figures),
        res: PriceResult,
    ) -> Pricing<'a> {
        // The DFlash score is the no-op's window over the candidate's: the baseline's serial
        // window cancels out of it, so a serial phase in every pair would buy only the record's
        // raw ratio (a third of a DFlash pricing's GPU time); the record takes that from the
        // pool's serial windows (`calibrate`).
        let roles: Vec<Role> = match inputs.p.track {
            Track::Serial => vec![Role::Baseline, Role::Candidate],
            Track::Dflash => vec![Role::Noop, Role::Candidate],
        };
        let expected_window =
            Duration::from_secs_f64(res.noise.as_ref().expect("set").median_seconds);
        let expected = roles.iter().map(|&r| (r, expected_window)).collect();
        Pricing {
            sides,
            inputs,
            progress,
            start,
            roles,
            pool_serial,
            expected,
            judge: Judge::default(),
            robust_pairs: vec![],
            mean_pairs: vec![],
            waitless_pairs: Some(vec![]),
            last: None,
            attempts: 0,
            busy_streak: 0,
            res,
        }
    }

    fn spec_of(&self, role: Role) -> &'a Spec {
        match role {
            Role::Baseline => &self.sides.baseline,
            Role::Candidate => &self.sides.candidate,
            Role::Noop => &self.sides.noop,
        }
    }

    /// Ends the pricing on a worker's fault (`end_with_fault`).
    fn fault(&mut self, f: Fault, culprit: Role) -> PairEnd {
        end_with_fault(&mut self.res, f, culprit, self.start);
        PairEnd::PricingOver
    }

    /// One pair attempt: its phases in this pair's order, the judging of the candidate's
    /// differing outputs, the outlier guard, then its record.
    fn pair(&mut self) -> Result<PairEnd> {
        let (p, attempt) = (self.inputs.p, self.attempts);
        // The order alternates by accepted pair, so an even count of accepted pairs is balanced
        // even when a pair had to be re-run.
        let candidate_first = self.robust_pairs.len() % 2 == 1;
        let mut order = self.roles.clone();
        if candidate_first {
            order.reverse();
        }
        let mut prompt_order: Vec<usize> = (0..self.inputs.pool.len()).collect();
        prompt_order.shuffle(&mut ChaCha8Rng::seed_from_u64(
            p.seed.wrapping_add(1 + attempt as u64),
        ));
        let mut pair = Pair {
            attempt,
            candidate_first,
            prompt_order,
            phases: vec![],
            accepted: true,
            rejected_because: None,
            score: None,
            mean_score: None,
        };
        let mut figures: HashMap<Role, PhaseFigures> = HashMap::new();
        // Re-running a disturbed or outlying pair would leave too few attempts for the pairs
        // still needed: keep it (the interval carries the noise).
        let last_chances =
            p.max_attempts - attempt <= p.rule.min_pairs.saturating_sub(self.robust_pairs.len());
        for role in order {
            match self.phase(role, &mut pair, last_chances)? {
                Ok(f) => figures.insert(role, f),
                Err(f) => return Ok(self.fault(f, role)),
            };
        }
        if pair
            .phases
            .iter()
            .any(|ph| ph.tokens_match_baseline == Some(false))
        {
            self.res.pairs_with_output_mismatch += 1;
        }
        match self.judge_timed_outputs() {
            Ok(None) => {}
            Ok(Some(detail)) => {
                self.res.pairs.push(pair);
                self.res.attempted_pair_count = attempt + 1;
                self.res.culprit = Some(Role::Candidate);
                self.res.verdict = "violation:timed_fidelity_divergence".into();
                self.res.detail = Some(detail);
                self.res.elapsed_seconds = self.start.elapsed().as_secs_f64();
                return Ok(PairEnd::PricingOver);
            }
            // The judge is the baseline's worker: its fault is the baseline's.
            Err(f) => return Ok(self.fault(f, Role::Baseline)),
        }
        // The outlier guard: a phase whose best window is far slower than its role's median
        // was disturbed throughout (a stall of the machine, not of the build); its pair is
        // re-run while attempts remain.
        if pair.accepted
            && self.robust_pairs.len() >= 3
            && !last_chances
            && outlying(&pair, &self.res.pairs, p.outlier_factor)
        {
            pair.accepted = false;
            pair.rejected_because
                .get_or_insert_with(|| "outlier".into());
        }
        self.record(pair, &figures);
        Ok(PairEnd::Recorded)
    }

    /// `role`'s phase of `pair`, added to it. The pair is not accepted when the phase started on
    /// a machine that never quieted (and quiet is required), or when none of its windows ran
    /// undisturbed (unless the pair must be kept: `KEEP_AFTER_DISTURBED`, `last_chances`).
    /// Returns the phase's figures (robust, mean, without waits), or its worker's fault.
    fn phase(
        &mut self,
        role: Role,
        pair: &mut Pair,
        last_chances: bool,
    ) -> Result<Result<PhaseFigures, Fault>> {
        let p = self.inputs.p;
        self.progress.set_message(pair_message(
            self.robust_pairs.len() + 1,
            role,
            self.last.as_ref(),
            p.time_budget_seconds - self.start.elapsed().as_secs_f64(),
        ));
        let drafts = p.track == Track::Dflash && role != Role::Baseline && p.draft == "drafter";
        let spec = drafting(self.spec_of(role), drafts);
        let expected = self
            .expected
            .get_mut(&role)
            .expect("every role has an expected window");
        let run = run_phase(
            &self.inputs,
            &spec,
            role,
            &pair.prompt_order,
            expected,
            &mut self.judge,
            &mut self.res,
        )?;
        let PhaseRun {
            phase,
            robust,
            mean,
            without_waits,
        } = match run {
            Ok(r) => r,
            Err(f) => return Ok(Err(f)),
        };
        if !phase.quiet.quiet && p.require_quiet {
            pair.accepted = false;
            pair.rejected_because = Some("not_quiescent".into());
        }
        if phase.undisturbed_windows == 0
            && self.busy_streak < KEEP_AFTER_DISTURBED
            && !last_chances
        {
            pair.accepted = false;
            pair.rejected_because
                .get_or_insert_with(|| "disturbed: no window without a run-queue wait".into());
        }
        pair.phases.push(phase);
        Ok(Ok((robust, mean, without_waits)))
    }

    /// Between pairs, never beside a timed window: the reference judges what differed. The
    /// detail of a timed output outside the envelope, or the reference worker's fault.
    fn judge_timed_outputs(&mut self) -> Result<Option<String>, Fault> {
        // The line reaches a public page mid-pricing, so it names no count of the candidate's
        // outputs.
        if !self.judge.pending.is_empty() {
            self.progress
                .set_message("judging the candidate's differing timed outputs".to_string());
        }
        let (p, model) = (self.inputs.p, self.inputs.model);
        let t0 = Instant::now();
        let diverged = self
            .judge
            .judge(&self.sides.baseline, model, self.inputs.pool, p.envelope);
        self.res.spent.judging += t0.elapsed().as_secs_f64();
        self.res.timed_fidelity = self.judge.report.clone();
        diverged
    }

    /// Scores `pair` from its phases' `figures`, adds an accepted pair's figures to the tally,
    /// and records it.
    fn record(&mut self, mut pair: Pair, figures: &HashMap<Role, PhaseFigures>) {
        let track = self.inputs.p.track;
        let of = |role: Role, robust: bool| {
            figures
                .get(&role)
                .map(|(r, m, _)| if robust { *r } else { *m })
        };
        let pool_serial = self.pool_serial;
        let get = |robust: bool| PairFigures {
            baseline: of(Role::Baseline, robust).unwrap_or(if robust {
                pool_serial.0
            } else {
                pool_serial.1
            }),
            candidate: of(Role::Candidate, robust).expect("every pair has a candidate"),
            noop: of(Role::Noop, robust),
        };
        let (rob, avg) = (get(true), get(false));
        // Without waits: every timed phase's figure, or none for the pair. The DFlash track's
        // baseline is the pool's serial windows (it cancels out of that score).
        let waitless = |role: Role| figures.get(&role).map(|(_, _, w)| *w);
        let without_waits = (|| {
            Some(PairFigures {
                baseline: waitless(Role::Baseline).unwrap_or(Some(pool_serial.0))?,
                candidate: waitless(Role::Candidate)??,
                noop: match waitless(Role::Noop) {
                    Some(w) => Some(w?),
                    None => None,
                },
            })
        })();
        pair.score = Some(score::score(track, &[rob], &[0]).score);
        pair.mean_score = Some(score::score(track, &[avg], &[0]).score);
        if pair.accepted {
            self.robust_pairs.push(rob);
            self.mean_pairs.push(avg);
            // One pair without the figure (no schedstat) and the check has nothing to go on.
            self.waitless_pairs = match (self.waitless_pairs.take(), without_waits) {
                (Some(mut v), Some(w)) => {
                    v.push(w);
                    Some(v)
                }
                _ => None,
            };
            self.res.accepted_pair_count += 1;
            self.progress.inc(1);
        }
        let disturbed = pair.phases.iter().any(|ph| ph.undisturbed_windows == 0);
        self.busy_streak = if disturbed { self.busy_streak + 1 } else { 0 };
        self.res.pairs.push(pair);
        self.attempts += 1;
    }

    /// The stopping rule after a recorded pair: once `min_pairs` are accepted, the interval over
    /// them, and whether it, the pair budget or the time budget ends the pricing.
    fn stopping(&mut self) -> Option<Stop> {
        let (p, r) = (self.inputs.p, &self.inputs.p.rule);
        if self.robust_pairs.len() < r.min_pairs {
            return None;
        }
        let iv = score::interval(p.track, &self.robust_pairs, r.min_pairs);
        self.last = Some(iv);
        let out_of_time = self.start.elapsed().as_secs_f64() >= p.time_budget_seconds;
        r.check(self.robust_pairs.len(), &iv, out_of_time)
    }

    /// The result once the pairs stopped for `stop`: the verdict from the accepted pairs.
    fn finish(mut self, stop: Stop) -> PriceResult {
        self.res.attempted_pair_count = self.attempts;
        self.res.pairs_used = self.robust_pairs.len();
        self.res.stopping_reason = Some(stop);
        self.res.elapsed_seconds = self.start.elapsed().as_secs_f64();
        conclude(
            self.res,
            self.inputs.p,
            &self.robust_pairs,
            &self.mean_pairs,
            self.waitless_pairs.as_deref(),
            self.last,
        )
    }
}

/// What every phase of a pricing reads: its parameters, the model, the machine's telemetry, the
/// prompt pool with the baseline's tokens for each, and the disturbed-window tolerance.
struct PhaseInputs<'a> {
    p: &'a PriceParams,
    model: &'a ModelId,
    telemetry: &'a Telemetry,
    pool: &'a [Vec<u32>],
    truth: &'a [Vec<u32>],
    tolerance: f64,
}

impl PhaseInputs<'_> {
    /// The window `role` runs on prompt `ix`: the baseline decodes serially; on the DFlash track
    /// the candidate and the no-op draft with the track's source, an oracle's drafts realised
    /// here from the baseline's tokens.
    fn request(&self, role: Role, ix: usize) -> Result<WindowRequest> {
        let p = self.p;
        let (prompt, truth) = (&self.pool[ix], &self.truth[ix]);
        if p.track == Track::Dflash && role != Role::Baseline {
            let block = (p.block_size, p.draft.as_str());
            WindowRequest::dflash(
                prompt,
                p.decode_tokens,
                block,
                truth,
                p.seed,
                self.model.vocab,
            )
        } else {
            Ok(WindowRequest::serial(prompt, p.decode_tokens))
        }
    }
}

/// A phase's record and its figures: the robust statistic (what the score uses) and the mean.
struct PhaseRun {
    phase: Phase,
    robust: Figures,
    mean: Figures,
    /// The robust figure of the windows less their run-queue waits (`WithoutWaits`); `None`
    /// where a window's wait is unknown.
    without_waits: Option<Figures>,
}

/// A phase's figures: robust, mean, and robust without run-queue waits.
type PhaseFigures = (Figures, Figures, Option<Figures>);

/// One phase of a pair: after waiting for a quiet machine, `role`'s fresh worker runs the
/// pair's prompts in `order` (warm-up windows first), each window sampled for disturbance and
/// stalls against the role's `expected` window (updated as it goes). Its time goes to
/// `res.spent`, the worker's build to `res`, and the candidate's outputs to `judge`. Returns the
/// phase's record with its robust and mean figures, or the worker's fault.
fn run_phase(
    inputs: &PhaseInputs,
    spec: &Spec,
    role: Role,
    order: &[usize],
    expected: &mut Duration,
    judge: &mut Judge,
    res: &mut PriceResult,
) -> Result<Result<PhaseRun, Fault>> {
    let (p, model) = (inputs.p, inputs.model);
    let quiet = quiesce(inputs.telemetry, &p.quiet);
    res.spent.quiet_waits += quiet.waited_seconds;
    let t0 = Instant::now();
    let mut w = match Worker::spawn(spec, model.vocab, &model.digest) {
        Ok(w) => w,
        Err(f) => return Ok(Err(f)),
    };
    let spawn_seconds = t0.elapsed().as_secs_f64();
    res.spent.start_ups += spawn_seconds;
    match role {
        Role::Baseline => {}
        Role::Candidate => {
            res.candidate.build = Some(w.ready.build.clone());
            res.candidate.flags = w.ready.flags.clone();
            res.machine.backend = Some(w.ready.backend.clone());
        }
        Role::Noop => {
            if let Some(n) = res.noop.as_mut() {
                n.build = Some(w.ready.build.clone());
            }
        }
    }
    let pid = w.pid();
    let mut windows = vec![];
    for (i, &ix) in order.iter().enumerate() {
        let mut sampler = Sampler::new(inputs.telemetry, *expected, p.stall_seconds);
        sampler.begin(pid);
        let t = match w.window(inputs.request(role, ix)?, &mut sampler) {
            Ok(t) => t,
            Err(f) => return Ok(Err(f)),
        };
        res.spent.windows += whole(&t);
        let tele = sampler.finish(pid);
        let truth = &inputs.truth[ix];
        if role == Role::Candidate {
            judge.note(ix, &t.tokens, truth);
        }
        *expected = Duration::from_secs_f64(whole(&t));
        let disturbed = noise::waited(whole(&t), tele.runqueue_wait_seconds, inputs.tolerance);
        windows.push(WindowRecord {
            prompt: ix,
            warmup: i < p.warmup_windows,
            disturbed,
            window_seconds: whole(&t),
            seeded_seconds: t.prefill_seconds,
            tokens_match_baseline: (role != Role::Baseline).then(|| t.tokens == *truth),
            telemetry: tele,
        });
    }
    w.shutdown();
    let scored = &windows[p.warmup_windows..];
    // The minimum is over every scored window: a disturbed window can only be slower, so
    // leaving it out can only raise the minimum. The clean count only decides whether the phase
    // was disturbed throughout.
    let all: Vec<f64> = scored.iter().map(|w| w.window_seconds).collect();
    let (rob, avg) = (noise::robust(&all), noise::means(&all));
    let without_waits = scored
        .iter()
        .map(window_without_waits)
        .collect::<Option<Vec<f64>>>()
        .map(|v| noise::robust(&v));
    let mismatch = windows
        .iter()
        .any(|w| w.tokens_match_baseline == Some(false));
    let phase = Phase {
        role,
        quiet,
        spawn_seconds,
        undisturbed_windows: scored.iter().filter(|w| !w.disturbed).count(),
        min_window_seconds: rob.window_seconds,
        mean_window_seconds: avg.window_seconds,
        tokens_match_baseline: (role != Role::Baseline).then_some(!mismatch),
        windows,
    };
    Ok(Ok(PhaseRun {
        phase,
        robust: rob,
        mean: avg,
        without_waits,
    }))
}

/// The progress line while a pair's phase runs: which, the interval so far (once there is one)
/// and the time budget left, e.g. `pair 7 Candidate; 1.0041 [0.9712, 1.0381], ±3.37 %; 212 s of
/// the time budget left`.
fn pair_message(pair: usize, role: Role, last: Option<&Interval>, left_seconds: f64) -> String {
    let interval = last
        .map(|iv| {
            format!(
                "; {:.4} [{:.4}, {:.4}], ±{:.2} %",
                iv.score,
                iv.lo,
                iv.hi,
                100.0 * iv.half_width
            )
        })
        .unwrap_or_default();
    format!(
        "pair {pair} {role:?}{interval}; {:.0} s of the time budget left",
        left_seconds.max(0.0)
    )
}

/// What the calibration worker leaves the pairs: the pool of prompts every phase runs, the
/// baseline's serial tokens of each (the oracle's truth, and what every other build's output is
/// compared with), and the baseline's serial figures over them.
struct Calibration {
    pool: Vec<Vec<u32>>,
    truth: Vec<Vec<u32>>,
    pool_serial: (Figures, Figures),
}

/// The noise measurement and the calibration, in one worker of `baseline`, never scored: warm-up
/// windows, identical windows (the noise, which sizes the scored windows of a phase), then the
/// pool's windows. Records the baseline's build, the noise and the windows per phase in `res`;
/// the inner error is the baseline worker's fault.
fn calibrate(
    baseline: &Spec,
    model: &ModelId,
    p: &PriceParams,
    tolerance: f64,
    res: &mut PriceResult,
) -> Result<Result<Calibration, Fault>> {
    macro_rules! fault {
        ($e:expr) => {
            match $e {
                Ok(v) => v,
                Err(f) => return Ok(Err(f)),
            }
        };
    }
    let vocab = model.vocab;
    // Prompt streams: the noise worker's warm-up and noise prompts, then the pool.
    let setup = prompts(
        p.seed ^ 0x006e_6f69_7365,
        p.warmup_windows + 1,
        p.prompt_tokens,
        vocab,
    )?;
    let (noise_prompt, warm_prompts) = setup.split_last().expect("at least one");
    let t0 = Instant::now();
    let mut w = fault!(Worker::spawn(
        &drafting(baseline, false),
        vocab,
        &model.digest
    ));
    let spawn_seconds = t0.elapsed().as_secs_f64();
    res.baseline.build = Some(w.ready.build.clone());
    for pr in warm_prompts {
        fault!(w.window(WindowRequest::serial(pr, p.decode_tokens), &mut NoTick));
    }
    let (mut noise_seconds, mut noise_waits) = (vec![], vec![]);
    for _ in 0..p.noise_windows {
        let before = runqueue_wait_seconds(w.pid());
        let t = fault!(w.window(
            WindowRequest::serial(noise_prompt, p.decode_tokens),
            &mut NoTick
        ));
        let after = runqueue_wait_seconds(w.pid());
        noise_seconds.push(whole(&t));
        noise_waits.push(before.zip(after).map(|(a, b)| b - a));
    }
    let nr = noise::size_windows(
        &noise_seconds,
        &noise_waits,
        tolerance,
        spawn_seconds,
        p.warmup_windows,
        p.windows,
    );
    let k = nr.windows_per_phase;
    res.windows_per_phase = Some(k);
    res.noise = Some(nr);
    let pool_size = p.warmup_windows + k;
    let pool = {
        let mut all = prompts(p.seed, pool_size + setup.len(), p.prompt_tokens, vocab)?;
        // Never a pool prompt the noise worker already ran.
        all.retain(|x| !setup.contains(x));
        all.truncate(pool_size);
        anyhow::ensure!(
            all.len() == pool_size,
            "cannot draw {pool_size} distinct prompts"
        );
        all
    };
    let (mut truth, mut pool_seconds) = (vec![], vec![]);
    for pr in &pool {
        let t = fault!(w.window(WindowRequest::serial(pr, p.decode_tokens), &mut NoTick));
        pool_seconds.push(whole(&t));
        truth.push(t.tokens);
    }
    // The baseline's serial figures where no pair times it (the DFlash track): its windows of
    // the pool, each prompt once in this warm worker. Only the record's raw ratio uses them.
    let pool_serial = (noise::robust(&pool_seconds), noise::means(&pool_seconds));
    w.shutdown();
    Ok(Ok(Calibration {
        pool,
        truth,
        pool_serial,
    }))
}

/// Whether a phase of `pair` has its best window more than `factor` times its role's median
/// best window over the `earlier` accepted pairs.
fn outlying(pair: &Pair, earlier: &[Pair], factor: f64) -> bool {
    pair.phases.iter().any(|ph| {
        let best: Vec<f64> = earlier
            .iter()
            .filter(|x| x.accepted)
            .flat_map(|x| x.phases.iter().filter(|q| q.role == ph.role))
            .map(|q| q.min_window_seconds)
            .collect();
        ph.min_window_seconds > factor * median(&best)
    })
}

/// A window less the run-queue wait its worker's tree did not cause itself
/// (`telemetry::excused_wait`): what `WithoutWaits` is made of; `None` where the wait is unknown.
/// A wait read over slightly more than the window (the sampler's first and last reads bracket
/// it) can exceed it: the figure is never below zero.
fn window_without_waits(w: &WindowRecord) -> Option<f64> {
    w.telemetry
        .excused_wait_seconds
        .map(|q| (w.window_seconds - q).max(0.0))
}

/// The verdict from the accepted pairs (`robust_pairs` the phases' minima, `mean_pairs` their
/// means, `waitless_pairs` their minima without run-queue waits, when known) and the last
/// interval: the timed near-tie budget, enough pairs, the score and its interval, the
/// plausibility guard, then the floor, a rejection standing only when the waits do not explain
/// it (`WithoutWaits`).
fn conclude(
    mut res: PriceResult,
    p: &PriceParams,
    robust_pairs: &[PairFigures],
    mean_pairs: &[PairFigures],
    waitless_pairs: Option<&[PairFigures]>,
    last: Option<Interval>,
) -> PriceResult {
    let (r, dflash) = (&p.rule, p.track == Track::Dflash);
    let tf = &mut res.timed_fidelity;
    tf.near_ties_allowed = check::near_ties_allowed(p.budget_per_1000, tf.tokens.total());
    if tf.tokens.near_tie > tf.near_ties_allowed {
        res.culprit = Some(Role::Candidate);
        res.verdict = "violation:timed_near_tie_budget".into();
        res.detail = Some(format!(
            "the candidate's timed outputs took {} near-ties in {} tokens, more than the {} the budget of {} per 1000 allows",
            tf.tokens.near_tie,
            tf.tokens.total(),
            tf.near_ties_allowed,
            p.budget_per_1000
        ));
        return res;
    }
    let n = robust_pairs.len();
    let Some(iv) = last.filter(|_| n >= r.min_pairs) else {
        res.verdict = "infra:too_few_accepted_pairs".into();
        res.detail = Some(format!(
            "{n} of {} pairs accepted after {} attempts (not quiescent, outliers, or disturbed: another process had the CPU through a phase)",
            r.min_pairs, res.attempted_pair_count
        ));
        return res;
    };
    let all: Vec<usize> = (0..n).collect();
    let c = score::score(p.track, robust_pairs, &all);
    let per_pair: Vec<f64> = res
        .pairs
        .iter()
        .filter(|x| x.accepted)
        .filter_map(|x| x.score)
        .collect();
    res.score = Some(iv.score);
    res.ratio_of_means = Some(iv.score);
    res.ci95 = Some([iv.lo, iv.hi]);
    res.half_width = Some(iv.half_width);
    res.median = Some(median(&per_pair));
    res.min = per_pair.iter().copied().reduce(f64::min);
    // Whole seconds per emitted token (prefill included) of a side's mean window.
    let per_token = |v: &[PairFigures], f: fn(&PairFigures) -> f64| {
        v.iter().map(f).sum::<f64>() / v.len() as f64 / (1 + p.decode_tokens) as f64
    };
    res.baseline_seconds_per_token = Some(per_token(robust_pairs, |x| x.baseline.window_seconds));
    res.candidate_seconds_per_token = Some(per_token(robust_pairs, |x| x.candidate.window_seconds));
    if dflash {
        res.raw_ratio_of_means = c.raw;
        res.noop_reference = c.noop;
        res.noop_seconds_per_token = Some(per_token(robust_pairs, |x| {
            x.noop.map_or(f64::NAN, |f| f.window_seconds)
        }));
    }
    let miv = score::interval(p.track, mean_pairs, r.min_pairs);
    res.mean_statistic = Some(MeanStatistic {
        score: miv.score,
        ci95: [miv.lo, miv.hi],
        half_width: miv.half_width,
        baseline_seconds_per_token: per_token(mean_pairs, |x| x.baseline.window_seconds),
        candidate_seconds_per_token: per_token(mean_pairs, |x| x.candidate.window_seconds),
    });
    let implausible = per_pair.iter().any(|&s| s > p.max_speedup)
        || robust_pairs.iter().any(|f| {
            let b = f.baseline.window_seconds;
            [Some(f.candidate), f.noop]
                .into_iter()
                .flatten()
                .any(|x| b / x.window_seconds > p.max_speedup)
        });
    if implausible {
        res.culprit = Some(Role::Candidate);
        res.verdict = "violation:implausible_speed".into();
        res.detail = Some(format!(
            "a pair is more than {}x faster than the baseline",
            p.max_speedup
        ));
        return res;
    }
    res.verdict = score::verdict(&iv, r.floor).into();
    if let Some(w) = waitless_pairs.filter(|w| w.len() == n) {
        let wiv = score::interval(p.track, w, r.min_pairs);
        let overruled = res.verdict == "below_floor" && wiv.hi >= r.floor;
        res.without_waits = Some(WithoutWaits {
            score: wiv.score,
            ci95: [wiv.lo, wiv.hi],
            overruled_rejection: overruled,
        });
        if overruled {
            res.verdict = "infra:inconclusive".into();
            res.passed = false;
            res.detail = Some(format!(
                "the whole 95 % interval [{:.4}, {:.4}] is below the floor {}, but not without the time the workers waited for other processes' CPU ({:.4} [{:.4}, {:.4}]): another process had the slower side's CPU, not the build",
                iv.lo, iv.hi, r.floor, wiv.score, wiv.lo, wiv.hi
            ));
            return res;
        }
    }
    res.passed = res.verdict == "passed";
    res.detail = match res.verdict.as_str() {
        "below_floor" => Some(format!(
            "the whole 95 % interval [{:.4}, {:.4}] is below the floor {}",
            iv.lo, iv.hi, r.floor
        )),
        "infra:inconclusive" => Some(format!(
            "the 95 % interval [{:.4}, {:.4}] still straddles the floor {} after {n} pairs ({})",
            iv.lo,
            iv.hi,
            r.floor,
            serde_json::to_value(res.stopping_reason)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default()
        )),
        _ => None,
    };
    res
}

/// The plain summary table.
pub fn summary(r: &PriceResult) -> String {
    let f = |x: Option<f64>| x.map(|v| format!("{v:.4}")).unwrap_or_else(|| "-".into());
    let pct = |x: Option<f64>| {
        x.map(|v| format!("{:.2} %", 100.0 * v))
            .unwrap_or_else(|| "-".into())
    };
    let us = |x: Option<f64>| {
        x.map(|v| format!("{:.1} us", v * 1e6))
            .unwrap_or_else(|| "-".into())
    };
    let mut s = String::new();
    let rows: Vec<(&str, String)> = vec![
        ("verdict", r.verdict.clone()),
        ("track", format!("{:?}", r.track).to_lowercase()),
        ("score", f(r.score)),
        (
            "95% CI",
            r.ci95
                .map(|[a, b]| format!("[{a:.4}, {b:.4}]"))
                .unwrap_or_else(|| "-".into()),
        ),
        (
            "half-width",
            format!(
                "{} (target {})",
                pct(r.half_width),
                r.target_ci.map_or("none".into(), |t| pct(Some(t)))
            ),
        ),
        ("floor", format!("{}", r.floor)),
        (
            "pairs",
            format!(
                "{} used of {} attempted, stopped: {}",
                r.pairs_used,
                r.attempted_pair_count,
                r.stopping_reason
                    .and_then(|s| serde_json::to_value(s).ok())
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_else(|| "-".into())
            ),
        ),
        (
            "windows per phase",
            format!(
                "{} scored + {} warm-up",
                r.windows_per_phase.map_or("-".into(), |k| k.to_string()),
                r.warmup_windows
            ),
        ),
        (
            "noise (median/min-1)",
            pct(r.noise.as_ref().map(|n| n.relative_spread)),
        ),
        (
            "median / min pair",
            format!("{} / {}", f(r.median), f(r.min)),
        ),
        ("raw ratio / noop", {
            match (r.raw_ratio_of_means, r.noop_reference) {
                (Some(a), Some(b)) => format!("{a:.4} / {b:.4}"),
                _ => "-".into(),
            }
        }),
        ("baseline s/token", us(r.baseline_seconds_per_token)),
        ("candidate s/token", us(r.candidate_seconds_per_token)),
        ("noop s/token", us(r.noop_seconds_per_token)),
        (
            "score from means",
            r.mean_statistic
                .as_ref()
                .map(|m| format!("{:.4} [{:.4}, {:.4}]", m.score, m.ci95[0], m.ci95[1]))
                .unwrap_or_else(|| "-".into()),
        ),
        (
            "score without waits",
            r.without_waits
                .as_ref()
                .map(|w| format!("{:.4} [{:.4}, {:.4}]", w.score, w.ci95[0], w.ci95[1]))
                .unwrap_or_else(|| "-".into()),
        ),
        (
            "output mismatches",
            r.pairs_with_output_mismatch.to_string(),
        ),
        ("timed outputs judged", {
            let t = &r.timed_fidelity;
            format!(
                "{} of {} differed; {} exact, {} near-tie, {} outside",
                t.judged_windows, t.windows, t.tokens.exact, t.tokens.near_tie, t.tokens.fail
            )
        }),
        ("seconds", format!("{:.1}", r.elapsed_seconds)),
        (
            "weights digest",
            r.weights_digest.chars().take(16).collect(),
        ),
    ];
    for (k, v) in rows {
        s += &format!("{k:<22} {v}\n");
    }
    if let Some(d) = &r.detail {
        s += &format!("{:<22} {d}\n", "detail");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 40 accepted pairs of a fresh-clone CI run (`be53d70`, issue 47) that rejected a
    /// no-op, the same binary priced as both sides, while two clippy jobs shared the 2-core
    /// machine: per pair the phases' best windows (ms) as priced, baseline then candidate, then
    /// the same less each window's run-queue wait. From pair 7 on the candidate's workers
    /// shared a CPU for whole phases (waiting about half of every window): 0.8505 [0.7726,
    /// 0.9363] as priced, 0.9885 [0.9588, 1.0191] without the waits.
    const CI_PAIRS: [(f64, f64, f64, f64); 40] = [
        (35.5, 33.7, 32.1, 31.2),
        (40.3, 33.2, 32.1, 32.7),
        (36.5, 34.1, 31.4, 31.4),
        (34.4, 34.7, 34.1, 32.0),
        (44.4, 68.4, 32.9, 37.2),
        (40.7, 43.2, 37.4, 39.0),
        (42.8, 46.3, 34.5, 33.2),
        (33.7, 40.7, 31.2, 34.0),
        (34.3, 40.2, 31.4, 33.6),
        (33.8, 33.8, 31.3, 31.2),
        (56.8, 65.8, 32.7, 32.0),
        (43.7, 40.5, 31.0, 36.0),
        (44.2, 68.5, 32.7, 34.8),
        (39.6, 53.2, 31.6, 32.9),
        (35.7, 39.2, 32.7, 37.4),
        (34.9, 60.2, 29.1, 33.5),
        (39.9, 51.4, 39.9, 38.4),
        (42.2, 35.6, 39.3, 32.6),
        (45.8, 54.4, 33.9, 40.8),
        (66.2, 35.2, 34.1, 34.0),
        (36.8, 49.1, 32.8, 34.0),
        (36.1, 38.9, 33.1, 33.6),
        (41.0, 44.2, 32.7, 32.7),
        (35.7, 38.1, 34.0, 32.8),
        (38.2, 36.1, 31.7, 33.2),
        (34.1, 34.8, 33.1, 32.0),
        (34.1, 34.8, 31.5, 32.2),
        (59.7, 53.9, 31.4, 31.6),
        (35.4, 60.9, 33.2, 40.7),
        (40.6, 41.7, 38.8, 38.0),
        (43.4, 42.1, 38.9, 40.2),
        (41.9, 82.0, 39.5, 41.8),
        (41.8, 82.6, 38.1, 40.4),
        (48.5, 71.8, 42.2, 31.9),
        (42.8, 34.0, 36.1, 31.4),
        (42.9, 71.4, 39.0, 38.4),
        (41.1, 47.9, 41.0, 41.3),
        (44.7, 71.9, 42.8, 39.6),
        (35.8, 39.7, 32.9, 30.6),
        (35.5, 35.1, 32.4, 32.1),
    ];

    fn params() -> PriceParams {
        PriceParams {
            track: Track::Serial,
            rule: Rule {
                min_pairs: 10,
                max_pairs: 40,
                target_half_width: Some(0.03),
                floor: 0.95,
            },
            time_budget_seconds: 600.0,
            prompt_tokens: 32,
            decode_tokens: 32,
            block_size: 1,
            draft: String::new(),
            seed: 0,
            quiet: QuietParams {
                max_cpu_busy: 1.0,
                max_gpu_util_pct: 5,
                max_gpu_temp_c: 60,
                max_wait_seconds: 1.0,
            },
            require_quiet: false,
            stall_seconds: 2.0,
            outlier_factor: 3.0,
            max_speedup: 100.0,
            max_attempts: 80,
            noise_windows: 16,
            warmup_windows: 2,
            windows: None,
            envelope: 0.0,
            budget_per_1000: 0.0,
        }
    }

    /// `conclude` over `pairs` (as priced, then without waits, in ms).
    fn verdict_of(pairs: &[(f64, f64, f64, f64)]) -> PriceResult {
        let p = params();
        let spec = Spec {
            bin: "fastdecode".into(),
            model: fastdecode_worker::protocol::ModelSource::Dir("m".into()),
            backend: "cpu".into(),
            flags: None,
            ready_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(1),
            drafter: false,
        };
        let sides = Sides {
            baseline: spec.clone(),
            candidate: spec.clone(),
            noop: spec,
        };
        let model = ModelId {
            source: fastdecode_worker::protocol::ModelSource::Dir("m".into()),
            vocab: 256,
            max_positions: 256,
            digest: "d".into(),
        };
        let fig = |ms: f64| Figures {
            window_seconds: ms / 1000.0,
        };
        let pair = |b: f64, c: f64| PairFigures {
            baseline: fig(b),
            candidate: fig(c),
            noop: None,
        };
        let priced: Vec<PairFigures> = pairs.iter().map(|&(b, c, _, _)| pair(b, c)).collect();
        let waitless: Vec<PairFigures> = pairs.iter().map(|&(_, _, b, c)| pair(b, c)).collect();
        let last = score::interval(Track::Serial, &priced, p.rule.min_pairs);
        let res = PriceResult::new(&p, &model, &sides, false, Machine::default());
        conclude(res, &p, &priced, &priced, Some(&waitless), Some(last))
    }

    /// The CI run's no-op, rejected there, is inconclusive: its slowdown was all run-queue
    /// waiting. Deterministic (recorded figures, no machine): it cannot fail by chance.
    #[test]
    fn a_slowdown_that_is_all_waiting_for_a_cpu_is_no_rejection() {
        let r = verdict_of(&CI_PAIRS);
        let w = r.without_waits.as_ref().expect("the waits were known");
        assert_eq!(r.verdict, "infra:inconclusive", "{:?}", r.detail);
        assert!(!r.passed);
        assert!(w.overruled_rejection);
        assert!(
            r.ci95.unwrap()[1] < 0.95,
            "rejected as priced: {:?}",
            r.ci95
        );
        assert!(w.ci95[0] <= 1.0 && 1.0 <= w.ci95[1], "{w:?}");
    }

    /// The check never saves a build that is slower in what it runs: the same pairs with the
    /// candidate 20 % slower in its own time (waits and all, as `fastdecode-faulty slow=1.2`
    /// sleeps in proportion to its window) are rejected, and so is a quarter slower build on a
    /// machine where neither side waited.
    #[test]
    fn a_build_slower_in_what_it_runs_is_still_rejected() {
        let slowed: Vec<_> = CI_PAIRS
            .iter()
            .map(|&(b, c, bw, cw)| (b, 1.2 * c, bw, cw + 0.2 * c))
            .collect();
        let r = verdict_of(&slowed);
        assert_eq!(r.verdict, "below_floor", "{:?}", r.without_waits);
        assert!(!r.without_waits.unwrap().overruled_rejection);
        let quiet: Vec<_> = CI_PAIRS
            .iter()
            .map(|&(_, _, b, c)| (b, 1.25 * c, b, 1.25 * c))
            .collect();
        let r = verdict_of(&quiet);
        assert_eq!(r.verdict, "below_floor", "{:?}", r.without_waits);
    }

    /// A window of `ms` whose tree's threads ran and waited `threads` (ms each) while the whole
    /// tree ran `tree_cpu_ms`, as the sampler records it.
    fn window(ms: f64, threads: &[(f64, f64)], tree_cpu_ms: f64) -> WindowRecord {
        let s: Vec<(f64, f64)> = threads.iter().map(|&(r, w)| (r / 1e3, w / 1e3)).collect();
        WindowRecord {
            prompt: 0,
            warmup: false,
            disturbed: false,
            window_seconds: ms / 1e3,
            seeded_seconds: 0.0,
            tokens_match_baseline: None,
            telemetry: WindowTelemetry {
                runqueue_wait_seconds: Some(s.iter().map(|t| t.1).sum()),
                excused_wait_seconds: Some(crate::telemetry::excused_wait(
                    &s,
                    Some(tree_cpu_ms / 1e3),
                )),
                ..Default::default()
            },
        }
    }

    /// The hole this closes (red-team case `price-oversubscribed`): a candidate that spawns
    /// busy threads beside its decode, more of them ready than the machine has CPUs, is slow
    /// because its decoding thread waits on a run queue behind its own helpers. On the CI run's
    /// pairs, each candidate window (its decode the CI no-op's own time, `cw`) is twice as long
    /// on 2 CPUs with three helpers: every thread runs half of it and waits the other half;
    /// the helpers are joined before the reply, so only the decoding thread's wait is in a
    /// schedstat at the window's end, and the helpers' time only in the process's CPU clock.
    /// The clock took out every wait its worker's threads had: the decode alone is left, the
    /// rejection was overruled to `infra:inconclusive` with no culprit (free, re-run once, then a
    /// free failure: never counted against the cap). Only the waits the tree did not cause come
    /// out now: none, and the rejection stands.
    #[test]
    fn a_slowdown_its_own_threads_make_is_still_rejected() {
        let (mut all_waits, mut excused) = (vec![], vec![]);
        for &(b, _, bw, cw) in &CI_PAIRS {
            let base = window(b, &[(bw, b - bw)], bw);
            let cand = window(2.0 * cw, &[(cw, cw)], 4.0 * cw);
            // What the clock took out before: every wait its threads' schedstats showed.
            let before =
                |w: &WindowRecord| w.window_seconds - w.telemetry.runqueue_wait_seconds.unwrap();
            let ms = |x: f64| x * 1e3;
            all_waits.push((b, 2.0 * cw, ms(before(&base)), ms(before(&cand))));
            let now = |w: &WindowRecord| ms(window_without_waits(w).unwrap());
            excused.push((b, 2.0 * cw, now(&base), now(&cand)));
        }
        let r = verdict_of(&all_waits);
        assert_eq!(r.verdict, "infra:inconclusive", "the hole: {:?}", r.detail);
        assert!(r.culprit.is_none() && r.without_waits.unwrap().overruled_rejection);
        let r = verdict_of(&excused);
        assert_eq!(r.verdict, "below_floor", "{:?}", r.without_waits);
        let w = r.without_waits.unwrap();
        assert!(!w.overruled_rejection && w.ci95[1] < 0.95, "{w:?}");
        // The baseline's windows, one thread waiting for another process, keep their waits
        // excused: the same figures as the CI replay's.
        assert!(excused
            .iter()
            .zip(&CI_PAIRS)
            .all(|(e, c)| (e.2 - c.2).abs() < 1e-9));
    }
}
