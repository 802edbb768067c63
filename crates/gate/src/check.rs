//! The behaviour gate. For each golden:
//!
//! 1. **Replay**: the candidate, teacher-forced on the golden's chain, must choose the golden's
//!    token at every step, or the golden's runner-up when the golden's top-2 gap is within the
//!    envelope (a near-tie).
//! 2. **Fidelity**: the candidate decodes freely; a live process of the *reference* build is then
//!    run teacher-forced on the candidate's own emitted chain, and each emitted token must be the
//!    reference's argmax, or within the envelope of the reference's top-1 logit (a near-tie).
//!    Once a near-tie has been taken the chains leave the golden, which is why the reference has
//!    to be live.
//! 3. **DFlash**: the candidate's DFlash output, with forced rejections (an oracle drafting the
//!    candidate's own chain with probability p), must equal its serial output exactly; so must
//!    its DFlash output with the track's own draft source (the drafter the pricing runs), so a
//!    build cannot be exact only under the oracle. The oracle's drafts are realised here and
//!    sent as drafts: no window of the gate hands the candidate a continuation to copy.
//!
//! Near-ties from all goldens count against one budget per 1000 checked tokens. A failure names a
//! category, the golden and the step, never a token or a logit.

use std::path::PathBuf;

use anyhow::{bail, Result};
use serde::Serialize;

use fastdecode_worker::protocol::{Step, WindowRequest};
use fastdecode_worker::{Build, Fault, ModelId, NoTick, Spec, Worker};

use crate::golden::Golden;

/// Envelope default: 8× the largest top-1 logit drift measured between the CPU reference and
/// builds with its numerics-affecting flags on (see crates/gate/DRIFT.md).
pub const DEFAULT_ENVELOPE: f32 = 1e-4;
/// Near-tie budget default, per 1000 checked tokens (crates/gate/DRIFT.md).
pub const DEFAULT_BUDGET: f64 = 2.0;

/// Largest DFlash block size of the exactness check (the engine's largest block).
pub const MAX_BLOCK_SIZE: usize = 16;

#[derive(Debug, Clone)]
pub struct GateParams {
    /// A non-argmax token passes as a near-tie when the reference's top-1 logit minus its logit is
    /// at most this.
    pub envelope: f32,
    /// Near-ties allowed per 1000 checked tokens.
    pub budget_per_1000: f64,
    /// DFlash block size of the exactness check (1 skips it).
    pub block_size: usize,
    /// Probability that the oracle drafts the right token (the rest are forced rejections).
    pub oracle_p: f64,
    /// The track's own DFlash window, block size and draft source (`drafter` or `oracle:P`),
    /// whose output must equal serial too.
    pub own_draft: Option<(usize, String)>,
}

impl GateParams {
    /// The parameters' own ranges: a mistake here is the caller's, found before any worker runs
    /// (and never blamed on a build).
    pub fn validate(&self) -> Result<()> {
        if !(self.envelope.is_finite() && self.envelope >= 0.0) {
            bail!("envelope {} must be a finite number >= 0", self.envelope);
        }
        if !(self.budget_per_1000.is_finite() && (0.0..=1000.0).contains(&self.budget_per_1000)) {
            bail!(
                "budget {} per 1000 must be in [0, 1000]",
                self.budget_per_1000
            );
        }
        if !(1..=MAX_BLOCK_SIZE).contains(&self.block_size) {
            bail!(
                "block size {} is outside 1..={MAX_BLOCK_SIZE}",
                self.block_size
            );
        }
        if !(0.0..=1.0).contains(&self.oracle_p) {
            bail!("oracle probability {} is not in [0, 1]", self.oracle_p);
        }
        if let Some((k, draft)) = &self.own_draft {
            if !(2..=MAX_BLOCK_SIZE).contains(k) {
                bail!("the draft source's block size {k} is outside 2..={MAX_BLOCK_SIZE}");
            }
            draft
                .parse::<fastdecode_engine::DraftSpec>()
                .map_err(|e| anyhow::anyhow!("draft source {draft:?}: {e}"))?;
        }
        Ok(())
    }
}

#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct Counts {
    pub exact: usize,
    pub near_tie: usize,
    pub fail: usize,
}

impl Counts {
    pub fn add(&mut self, o: Counts) {
        self.exact += o.exact;
        self.near_tie += o.near_tie;
        self.fail += o.fail;
    }
    pub fn total(&self) -> usize {
        self.exact + self.near_tie + self.fail
    }
}

/// The near-ties `budget_per_1000` allows over `checked` tokens.
pub fn near_ties_allowed(budget_per_1000: f64, checked: usize) -> usize {
    (budget_per_1000 * checked as f64 / 1000.0).floor() as usize
}

/// The fidelity rule: `judged` is the reference teacher-forced (with probes) on the chain
/// `emitted`; each emitted token must be the reference's argmax, or within `envelope` of its
/// top-1 logit (a near-tie). Returns the counts up to and including the first token outside the
/// envelope, and that token's step. The clock judges its timed windows by the same rule.
pub fn fidelity(judged: &[Step], emitted: &[u32], envelope: f32) -> (Counts, Option<usize>) {
    let mut c = Counts::default();
    for (i, (s, &e)) in judged.iter().zip(emitted).enumerate() {
        let probe = s.probe_logit.unwrap_or(f32::NEG_INFINITY);
        if s.top[0].id == e {
            c.exact += 1;
        } else if s.top[0].logit - probe <= envelope {
            c.near_tie += 1;
        } else {
            c.fail += 1;
            return (c, Some(i));
        }
    }
    (c, None)
}

/// The first thing that went wrong, redacted: a category and where.
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    /// `replay_divergence`, `fidelity_divergence`, `dflash_inexact`, `near_tie_budget`,
    /// `infra:...` or `violation:...`.
    pub category: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub golden: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<usize>,
    /// Which side: `candidate` or `reference`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub side: Option<String>,
    /// For a worker's fault, what the parent saw (the worker's own error message, how it
    /// exited): never a golden's token or logit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GoldenReport {
    pub golden: String,
    pub tokens: usize,
    pub replay: Counts,
    pub fidelity: Counts,
    pub dflash_exact: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GateReport {
    pub passed: bool,
    pub failure: Option<Failure>,
    pub goldens: Vec<GoldenReport>,
    pub replay: Counts,
    pub fidelity: Counts,
    pub checked_tokens: usize,
    pub near_ties: usize,
    pub near_ties_allowed: usize,
    pub envelope: f32,
    pub budget_per_1000: f64,
    pub reference: Option<Build>,
    pub candidate: Option<Build>,
    /// Seconds from spawning each side's worker to its `ready` line.
    pub candidate_ready_seconds: Option<f64>,
    pub reference_ready_seconds: Option<f64>,
}

fn fail(
    category: impl Into<String>,
    golden: Option<&str>,
    step: Option<usize>,
    side: Option<&str>,
) -> Failure {
    Failure {
        category: category.into(),
        golden: golden.map(str::to_string),
        step,
        side: side.map(str::to_string),
        detail: None,
    }
}

fn fault(f: &Fault, golden: Option<&str>, side: &str) -> Failure {
    let (Fault::Infra { detail, .. } | Fault::Violation { detail, .. }) = f;
    Failure {
        detail: Some(detail.clone()),
        ..fail(f.category(), golden, None, Some(side))
    }
}

/// Runs the gate; an `Err` is a problem of the gate's own inputs (unreadable model), everything
/// the workers do is in the report.
pub fn run(
    reference: &Spec,
    candidate: &Spec,
    model: &ModelId,
    goldens: &[(PathBuf, Golden)],
    p: &GateParams,
    progress: &indicatif::ProgressBar,
) -> Result<GateReport> {
    let mut rep = GateReport {
        passed: false,
        failure: None,
        goldens: vec![],
        replay: Counts::default(),
        fidelity: Counts::default(),
        checked_tokens: 0,
        near_ties: 0,
        near_ties_allowed: 0,
        envelope: p.envelope,
        budget_per_1000: p.budget_per_1000,
        reference: None,
        candidate: None,
        candidate_ready_seconds: None,
        reference_ready_seconds: None,
    };
    p.validate()?;
    for (path, g) in goldens {
        // A golden the model cannot run is the gate's input at fault, not a build.
        g.fits(path, model)?;
    }
    for (path, g) in goldens {
        if g.model_digest != model.digest {
            rep.failure = Some(fail(
                "golden_model_mismatch",
                Some(&path.display().to_string()),
                None,
                None,
            ));
            return Ok(rep);
        }
    }
    let t0 = std::time::Instant::now();
    // Only the track's own source can draft with the drafter; the oracle's windows and every
    // replay need none, and a worker told so starts seconds sooner.
    let drafts = p.own_draft.as_ref().is_some_and(|(_, d)| d == "drafter");
    let candidate = Spec {
        drafter: candidate.drafter && drafts,
        ..candidate.clone()
    };
    let mut cand = match Worker::spawn(&candidate, model.vocab, &model.digest) {
        Ok(w) => w,
        Err(f) => {
            rep.failure = Some(fault(&f, None, "candidate"));
            return Ok(rep);
        }
    };
    rep.candidate = Some(cand.ready.build.clone());
    rep.candidate_ready_seconds = Some(t0.elapsed().as_secs_f64());
    let largest = p.own_draft.as_ref().map_or(0, |d| d.0).max(p.block_size);
    if largest > cand.ready.max_block {
        bail!(
            "block size {largest} is above the candidate's largest DFlash block {}",
            cand.ready.max_block
        );
    }
    let t0 = std::time::Instant::now();
    let reference = Spec {
        drafter: false,
        ..reference.clone()
    };
    let mut refw = match Worker::spawn(&reference, model.vocab, &model.digest) {
        Ok(w) => w,
        Err(f) => {
            rep.failure = Some(fault(&f, None, "reference"));
            return Ok(rep);
        }
    };
    rep.reference = Some(refw.ready.build.clone());
    rep.reference_ready_seconds = Some(t0.elapsed().as_secs_f64());
    progress.set_length(goldens.len() as u64);
    for (path, g) in goldens {
        let name = path.display().to_string();
        progress.set_message(name.clone());
        let mut r = GoldenReport {
            golden: name.clone(),
            tokens: g.tokens.len(),
            replay: Counts::default(),
            fidelity: Counts::default(),
            dflash_exact: None,
        };
        let outcome = check_one(&mut cand, &mut refw, g, &name, (p, model.vocab), &mut r);
        rep.replay.add(r.replay);
        rep.fidelity.add(r.fidelity);
        rep.goldens.push(r);
        if let Err(f) = outcome {
            rep.failure = Some(f);
            break;
        }
        progress.inc(1);
    }
    cand.shutdown();
    refw.shutdown();
    rep.checked_tokens = rep.replay.total() + rep.fidelity.total();
    rep.near_ties = rep.replay.near_tie + rep.fidelity.near_tie;
    rep.near_ties_allowed = near_ties_allowed(p.budget_per_1000, rep.checked_tokens);
    if rep.failure.is_none() && rep.near_ties > rep.near_ties_allowed {
        rep.failure = Some(fail("near_tie_budget", None, None, None));
    }
    rep.passed = rep.failure.is_none();
    Ok(rep)
}

fn check_one(
    cand: &mut Worker,
    refw: &mut Worker,
    g: &Golden,
    name: &str,
    (p, vocab): (&GateParams, usize),
    r: &mut GoldenReport,
) -> Result<(), Failure> {
    let on = |side: &'static str| move |f: Fault| fault(&f, Some(name), side);
    // The reference must reproduce the golden, or the gate compares against the wrong build.
    let own = refw
        .replay(&g.prompt, &g.tokens, false)
        .map_err(on("reference"))?;
    if let Some(i) = own
        .iter()
        .zip(&g.tokens)
        .position(|(s, &t)| s.top[0].id != t)
    {
        return Err(fail(
            "infra:reference_mismatch",
            Some(name),
            Some(i),
            Some("reference"),
        ));
    }
    // 1. Teacher-forced replay of the candidate on the golden chain.
    let steps = cand
        .replay(&g.prompt, &g.tokens, false)
        .map_err(on("candidate"))?;
    for (i, (s, gs)) in steps.iter().zip(&g.steps).enumerate() {
        let c = s.top[0].id;
        if c == gs.top[0].id {
            r.replay.exact += 1;
        } else if c == gs.top[1].id && gs.top[0].logit - gs.top[1].logit <= p.envelope {
            r.replay.near_tie += 1;
        } else {
            r.replay.fail += 1;
            return Err(fail(
                "replay_divergence",
                Some(name),
                Some(i),
                Some("candidate"),
            ));
        }
    }
    // 2. Free decoding by the candidate, judged by the live reference on the candidate's chain.
    let n = g.tokens.len();
    let emitted = cand
        .window(WindowRequest::serial(&g.prompt, n - 1), &mut NoTick)
        .map_err(on("candidate"))?
        .tokens;
    // A chain that is the golden's was judged above: the reference's replay of it, every top
    // token the chain's own (what a second replay of the same chain would say, and what
    // `fidelity` counts as exact without reading a probe). Only another chain is replayed.
    let judged = if emitted == g.tokens {
        own
    } else {
        refw.replay(&g.prompt, &emitted, true)
            .map_err(on("reference"))?
    };
    let (counts, diverged) = fidelity(&judged, &emitted, p.envelope);
    r.fidelity = counts;
    if let Some(i) = diverged {
        return Err(fail(
            "fidelity_divergence",
            Some(name),
            Some(i),
            Some("candidate"),
        ));
    }
    // 3. DFlash must reproduce the candidate's serial output exactly: with forced rejections
    // (the oracle drafting the candidate's own chain), and with the track's own source.
    let forced = (p.block_size > 1).then(|| (p.block_size, format!("oracle:{}", p.oracle_p)));
    for (k, draft) in forced.iter().chain(&p.own_draft) {
        let d = WindowRequest::dflash(&g.prompt, n - 1, (*k, draft), &emitted, 7, vocab).map_err(
            |e| Failure {
                detail: Some(format!("{e:#}")),
                ..fail("infra:gate_input", Some(name), None, None)
            },
        )?;
        let got = cand.window(d, &mut NoTick).map_err(on("candidate"))?.tokens;
        let exact = got == emitted;
        r.dflash_exact = Some(exact);
        if !exact {
            let i = got.iter().zip(&emitted).position(|(a, b)| a != b);
            return Err(fail("dflash_inexact", Some(name), i, Some("candidate")));
        }
    }
    Ok(())
}
