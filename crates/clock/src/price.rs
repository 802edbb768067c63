//! Paired pricing. Each pair times the baseline and the candidate (and, on the DFlash track, the
//! no-op) in fresh worker processes, one phase each, in alternating order; the parent times only
//! the window, checks the machine is quiet before each phase and samples it during the window.
//!
//! Scores (`challenge.md`): serial = decode_speedup^0.75 · prefill_speedup^0.25, each speedup a
//! ratio of mean seconds per token; DFlash = raw / noop with raw = mean baseline serial s/token ÷
//! mean candidate DFlash s/token and noop the same ratio for the unmodified no-op build, measured in
//! the same run. The floor rejects a candidate only when the whole 95 % interval lies below it, so
//! the rule's tolerance is the run's own measured variance, not a band tuned at another window
//! length.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use anyhow::Result;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use fastdecode_worker::protocol::WindowRequest;
use fastdecode_worker::{Build, Fault, ModelId, NoTick, Spec, Worker};

use crate::stats::{bootstrap_ci, mean, median};
use crate::telemetry::{quiesce, QuietCheck, QuietParams, Sampler, Telemetry, WindowTelemetry};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Track {
    Serial,
    Dflash,
}

impl FromStr for Track {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "serial" => Ok(Track::Serial),
            "dflash" => Ok(Track::Dflash),
            o => Err(format!("unknown track {o:?} (serial or dflash)")),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Baseline,
    Candidate,
    Noop,
}

#[derive(Debug, Clone)]
pub struct PriceParams {
    pub track: Track,
    pub pairs: usize,
    pub prompt_tokens: usize,
    pub decode_tokens: usize,
    /// DFlash track: block size and draft source of the candidate's and no-op's windows.
    pub block_size: usize,
    pub draft: String,
    pub seed: u64,
    pub floor: f64,
    pub resamples: usize,
    pub quiet: QuietParams,
    /// The stall guard: a worker with no progress for this long is killed (infra).
    pub stall_seconds: f64,
    /// A pair whose phase took more than this many times its role's median is not accepted.
    pub outlier_factor: f64,
    /// Plausibility cap: a speed-up above this is a violation, not a score.
    pub max_speedup: f64,
    /// Pair attempts allowed in all (re-runs of unaccepted pairs included).
    pub max_attempts: usize,
}

pub struct Sides {
    pub baseline: Spec,
    pub candidate: Spec,
    /// The unmodified build that normalises the DFlash track (usually the baseline binary).
    pub noop: Spec,
}

#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    pub role: Role,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    pub prefill_seconds_per_token: f64,
    pub decode_seconds_per_token: f64,
    pub tokens_match_baseline: Option<bool>,
    pub quiet: QuietCheck,
    pub telemetry: WindowTelemetry,
}

#[derive(Debug, Clone, Serialize)]
pub struct Pair {
    pub attempt: usize,
    pub candidate_first: bool,
    pub phases: Vec<Phase>,
    pub accepted: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejected_because: Option<String>,
    pub score: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SideInfo {
    pub bin: PathBuf,
    pub build: Option<Build>,
    pub flags: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PriceResult {
    /// `passed`, `below_floor`, `infra:...` or `violation:...`.
    pub verdict: String,
    pub passed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    pub track: Track,
    pub score: Option<f64>,
    pub ci95: Option<[f64; 2]>,
    pub ci_method: &'static str,
    pub bootstrap_resamples: usize,
    pub bootstrap_seed: u64,
    pub floor: f64,
    pub accepted_pair_count: usize,
    pub attempted_pair_count: usize,
    pub ratio_of_means: Option<f64>,
    pub decode_ratio_of_means: Option<f64>,
    pub prefill_ratio_of_means: Option<f64>,
    pub raw_ratio_of_means: Option<f64>,
    pub noop_reference: Option<f64>,
    pub median: Option<f64>,
    pub min: Option<f64>,
    pub baseline_seconds_per_token: Option<f64>,
    pub candidate_seconds_per_token: Option<f64>,
    pub noop_seconds_per_token: Option<f64>,
    pub baseline_prefill_seconds_per_token: Option<f64>,
    pub candidate_prefill_seconds_per_token: Option<f64>,
    pub pairs_with_output_mismatch: usize,
    pub weights_digest: String,
    pub gpu_telemetry: bool,
    pub prompt_tokens: usize,
    pub decode_tokens: usize,
    pub block_size: usize,
    pub draft: String,
    pub baseline: SideInfo,
    pub candidate: SideInfo,
    pub noop: Option<SideInfo>,
    pub pairs: Vec<Pair>,
}

/// Seconds per token of each role over the pairs in `ix`, and the score they give.
struct Sums<'a> {
    track: Track,
    pairs: &'a [&'a Pair],
}

impl Sums<'_> {
    fn per_token(&self, ix: &[usize], role: Role, prefill: bool) -> f64 {
        let v: Vec<f64> = ix
            .iter()
            .filter_map(|&i| self.pairs[i].phases.iter().find(|p| p.role == role))
            .map(|p| {
                if prefill {
                    p.prefill_seconds_per_token
                } else {
                    p.decode_seconds_per_token
                }
            })
            .collect();
        mean(&v)
    }
    /// (score, first component, second component): serial (score, decode, prefill ratios);
    /// DFlash (score, raw, noop).
    fn score(&self, ix: &[usize]) -> (f64, f64, f64) {
        let b = self.per_token(ix, Role::Baseline, false);
        let c = self.per_token(ix, Role::Candidate, false);
        match self.track {
            Track::Serial => {
                let dec = b / c;
                let pre = self.per_token(ix, Role::Baseline, true)
                    / self.per_token(ix, Role::Candidate, true);
                (dec.powf(0.75) * pre.powf(0.25), dec, pre)
            }
            Track::Dflash => {
                let raw = b / c;
                let noop = b / self.per_token(ix, Role::Noop, false);
                (raw / noop, raw, noop)
            }
        }
    }
}

fn random_prompt(seed: u64, len: usize, vocab: usize) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..len)
        .map(|_| rng.random_range(0..vocab as u32))
        .collect()
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

pub fn run(
    sides: &Sides,
    model: &ModelId,
    p: &PriceParams,
    progress: &indicatif::ProgressBar,
) -> Result<PriceResult> {
    anyhow::ensure!(
        p.pairs >= 4,
        "--pairs must be at least 4 for a confidence interval"
    );
    anyhow::ensure!(
        p.prompt_tokens >= 1 && p.decode_tokens >= 1,
        "the window needs at least one prompt and one decode token"
    );
    anyhow::ensure!(
        p.track == Track::Serial || p.block_size >= 2,
        "the dflash track needs --block-size of at least 2"
    );
    let telemetry = Telemetry::new();
    let mut res = PriceResult {
        verdict: String::new(),
        passed: false,
        detail: None,
        track: p.track,
        score: None,
        ci95: None,
        ci_method: "expanded percentile bootstrap over pairs",
        bootstrap_resamples: p.resamples,
        bootstrap_seed: p.seed,
        floor: p.floor,
        accepted_pair_count: 0,
        attempted_pair_count: 0,
        ratio_of_means: None,
        decode_ratio_of_means: None,
        prefill_ratio_of_means: None,
        raw_ratio_of_means: None,
        noop_reference: None,
        median: None,
        min: None,
        baseline_seconds_per_token: None,
        candidate_seconds_per_token: None,
        noop_seconds_per_token: None,
        baseline_prefill_seconds_per_token: None,
        candidate_prefill_seconds_per_token: None,
        pairs_with_output_mismatch: 0,
        weights_digest: model.digest.clone(),
        gpu_telemetry: telemetry.has_gpu(),
        prompt_tokens: p.prompt_tokens,
        decode_tokens: p.decode_tokens,
        block_size: if p.track == Track::Dflash {
            p.block_size
        } else {
            1
        },
        draft: if p.track == Track::Dflash {
            p.draft.clone()
        } else {
            String::new()
        },
        baseline: side(&sides.baseline, None),
        candidate: side(&sides.candidate, None),
        noop: (p.track == Track::Dflash).then(|| side(&sides.noop, None)),
        pairs: vec![],
    };
    let roles: Vec<Role> = match p.track {
        Track::Serial => vec![Role::Baseline, Role::Candidate],
        Track::Dflash => vec![Role::Baseline, Role::Candidate, Role::Noop],
    };
    let spec_of = |r: Role| match r {
        Role::Baseline => &sides.baseline,
        Role::Candidate => &sides.candidate,
        Role::Noop => &sides.noop,
    };
    // Re-run pairs reuse the prompts of the first `pairs` slots.
    let prompt_of = |attempt: usize| {
        random_prompt(
            p.seed.wrapping_add((attempt % p.pairs) as u64),
            p.prompt_tokens,
            model.vocab,
        )
    };
    let request = |role: Role, prompt: Vec<u32>, truth: Option<Vec<u32>>| {
        let dflash = p.track == Track::Dflash && role != Role::Baseline;
        WindowRequest {
            id: 0,
            prompt,
            decode_tokens: p.decode_tokens,
            block_size: if dflash { p.block_size } else { 1 },
            draft: dflash.then(|| p.draft.clone()),
            seed: p.seed,
            truth: if dflash { truth } else { None },
        }
    };
    let fail = |mut res: PriceResult, f: Fault| {
        res.verdict = f.category();
        res.detail = Some(f.to_string());
        Ok(res)
    };
    // Calibration (never scored): the baseline's serial tokens of every prompt, which are the
    // oracle's truth and what the candidate's output is compared with, and the window lengths
    // that set the sampling interval.
    progress.set_message("calibrating");
    let mut truth = vec![];
    let mut expected = std::collections::HashMap::new();
    {
        let mut w = match Worker::spawn(&sides.baseline, model.vocab, &model.digest) {
            Ok(w) => w,
            Err(f) => return fail(res, f),
        };
        for slot in 0..p.pairs {
            let t = match w.window(request(Role::Baseline, prompt_of(slot), None), &mut NoTick) {
                Ok(t) => t,
                Err(f) => return fail(res, f),
            };
            let d = Duration::from_secs_f64(t.prefill_seconds + t.decode_seconds);
            for &r in &roles {
                expected.entry(r).or_insert(d);
            }
            truth.push(t.tokens);
        }
        w.shutdown();
    }
    progress.set_length(p.pairs as u64);
    let mut attempt = 0;
    while res.accepted_pair_count < p.pairs && attempt < p.max_attempts {
        let candidate_first = attempt % 2 == 1;
        let mut order = roles.clone();
        if candidate_first {
            order.reverse();
        }
        let mut pair = Pair {
            attempt,
            candidate_first,
            phases: vec![],
            accepted: true,
            rejected_because: None,
            score: None,
        };
        for role in order {
            progress.set_message(format!("pair {} {:?}", res.accepted_pair_count + 1, role));
            let quiet = quiesce(&telemetry, &p.quiet);
            if !quiet.quiet {
                pair.accepted = false;
                pair.rejected_because = Some("not_quiescent".into());
            }
            let mut w = match Worker::spawn(spec_of(role), model.vocab, &model.digest) {
                Ok(w) => w,
                Err(f) => return fail(res, f),
            };
            match role {
                Role::Baseline => res.baseline.build = Some(w.ready.build.clone()),
                Role::Candidate => {
                    res.candidate.build = Some(w.ready.build.clone());
                    res.candidate.flags = w.ready.flags.clone();
                }
                Role::Noop => {
                    if let Some(n) = res.noop.as_mut() {
                        n.build = Some(w.ready.build.clone());
                    }
                }
            }
            let pid = w.pid();
            let mut sampler = Sampler::new(&telemetry, expected[&role], p.stall_seconds);
            sampler.begin(pid);
            let t = match w.window(
                request(
                    role,
                    prompt_of(attempt),
                    Some(truth[attempt % p.pairs].clone()),
                ),
                &mut sampler,
            ) {
                Ok(t) => t,
                Err(f) => return fail(res, f),
            };
            let tele = sampler.finish(pid);
            w.shutdown();
            expected.insert(
                role,
                Duration::from_secs_f64(t.prefill_seconds + t.decode_seconds),
            );
            let same = t.tokens == truth[attempt % p.pairs];
            pair.phases.push(Phase {
                role,
                prefill_seconds: t.prefill_seconds,
                decode_seconds: t.decode_seconds,
                prefill_seconds_per_token: t.prefill_seconds / p.prompt_tokens as f64,
                decode_seconds_per_token: t.decode_seconds / p.decode_tokens as f64,
                tokens_match_baseline: (role != Role::Baseline).then_some(same),
                quiet,
                telemetry: tele,
            });
        }
        if pair
            .phases
            .iter()
            .any(|ph| ph.tokens_match_baseline == Some(false))
        {
            res.pairs_with_output_mismatch += 1;
        }
        if pair.accepted {
            res.accepted_pair_count += 1;
            progress.inc(1);
        }
        res.pairs.push(pair);
        attempt += 1;
        // The outlier guard: a phase far slower than its role's median was disturbed (a stall of
        // the machine, not of the build); its pair is re-run while attempts remain.
        if res.accepted_pair_count == p.pairs {
            reject_outliers(&mut res, &roles, p.outlier_factor);
        }
    }
    res.attempted_pair_count = attempt;
    let accepted: Vec<&Pair> = res.pairs.iter().filter(|x| x.accepted).collect();
    if accepted.len() < p.pairs {
        res.verdict = "infra:too_few_accepted_pairs".into();
        res.detail = Some(format!(
            "{} of {} pairs accepted after {attempt} attempts (not quiescent or disturbed)",
            accepted.len(),
            p.pairs
        ));
        return Ok(res);
    }
    let sums = Sums {
        track: p.track,
        pairs: &accepted,
    };
    let all: Vec<usize> = (0..accepted.len()).collect();
    let (score, a, b) = sums.score(&all);
    let per_pair: Vec<f64> = all.iter().map(|&i| sums.score(&[i]).0).collect();
    let (lo, hi) = bootstrap_ci(accepted.len(), p.resamples, p.seed, |ix| sums.score(ix).0);
    res.score = Some(score);
    res.ratio_of_means = Some(score);
    res.ci95 = Some([lo, hi]);
    res.median = Some(median(&per_pair));
    res.min = per_pair.iter().copied().reduce(f64::min);
    res.baseline_seconds_per_token = Some(sums.per_token(&all, Role::Baseline, false));
    res.candidate_seconds_per_token = Some(sums.per_token(&all, Role::Candidate, false));
    match p.track {
        Track::Serial => {
            res.decode_ratio_of_means = Some(a);
            res.prefill_ratio_of_means = Some(b);
            res.baseline_prefill_seconds_per_token =
                Some(sums.per_token(&all, Role::Baseline, true));
            res.candidate_prefill_seconds_per_token =
                Some(sums.per_token(&all, Role::Candidate, true));
        }
        Track::Dflash => {
            res.raw_ratio_of_means = Some(a);
            res.noop_reference = Some(b);
            res.noop_seconds_per_token = Some(sums.per_token(&all, Role::Noop, false));
        }
    }
    let implausible = accepted.iter().zip(&per_pair).any(|(pair, &s)| {
        let max_ratio = pair.phases.iter().map(|ph| {
            let b = pair
                .phases
                .iter()
                .find(|x| x.role == Role::Baseline)
                .expect("every pair has a baseline");
            (b.decode_seconds_per_token / ph.decode_seconds_per_token)
                .max(b.prefill_seconds_per_token / ph.prefill_seconds_per_token)
        });
        s > p.max_speedup || max_ratio.fold(0.0, f64::max) > p.max_speedup
    });
    for (pair, s) in res.pairs.iter_mut().filter(|x| x.accepted).zip(&per_pair) {
        pair.score = Some(*s);
    }
    if implausible {
        res.verdict = "violation:implausible_speed".into();
        res.detail = Some(format!(
            "a pair is more than {}x faster than the baseline",
            p.max_speedup
        ));
    } else if hi < p.floor {
        res.verdict = "below_floor".into();
        res.detail = Some(format!(
            "the whole 95 % interval [{lo:.3}, {hi:.3}] is below the floor {}",
            p.floor
        ));
    } else {
        res.verdict = "passed".into();
        res.passed = true;
    }
    Ok(res)
}

/// Marks accepted pairs with a phase over `factor` × its role's median window as not accepted.
fn reject_outliers(res: &mut PriceResult, roles: &[Role], factor: f64) {
    let window = |ph: &Phase| ph.prefill_seconds + ph.decode_seconds;
    for &role in roles {
        let v: Vec<f64> = res
            .pairs
            .iter()
            .filter(|x| x.accepted)
            .flat_map(|x| x.phases.iter().filter(|ph| ph.role == role).map(window))
            .collect();
        let m = median(&v);
        for pair in res.pairs.iter_mut().filter(|x| x.accepted) {
            if pair
                .phases
                .iter()
                .any(|ph| ph.role == role && window(ph) > factor * m)
            {
                pair.accepted = false;
                pair.rejected_because = Some("disturbed".into());
                res.accepted_pair_count -= 1;
            }
        }
    }
}

/// The plain summary table.
pub fn summary(r: &PriceResult) -> String {
    let f = |x: Option<f64>| x.map(|v| format!("{v:.4}")).unwrap_or_else(|| "-".into());
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
        ("floor", format!("{}", r.floor)),
        (
            "accepted pairs",
            format!(
                "{} of {} attempted",
                r.accepted_pair_count, r.attempted_pair_count
            ),
        ),
        (
            "median / min pair",
            format!("{} / {}", f(r.median), f(r.min)),
        ),
        (
            "decode ratio",
            f(r.decode_ratio_of_means.or(r.raw_ratio_of_means)),
        ),
        (
            "prefill ratio / noop",
            f(r.prefill_ratio_of_means.or(r.noop_reference)),
        ),
        ("baseline s/token", us(r.baseline_seconds_per_token)),
        ("candidate s/token", us(r.candidate_seconds_per_token)),
        ("noop s/token", us(r.noop_seconds_per_token)),
        (
            "output mismatches",
            r.pairs_with_output_mismatch.to_string(),
        ),
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
