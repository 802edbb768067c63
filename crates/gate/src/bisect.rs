//! Finding the optimisation flag that makes a build diverge from a golden: replay the goldens with
//! sets of flags switched on, halving the set that diverges until one flag (or the smallest
//! interacting set) is left. Each tested set runs in a fresh worker (`--flags`), since flags are
//! chosen at start-up.

use std::path::PathBuf;

use anyhow::{bail, Result};
use serde::Serialize;

use fastdecode_worker::{ModelId, Spec, Worker};

use crate::golden::Golden;

/// What counts as diverging.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Criterion {
    /// Any step's argmax differs from the golden's token.
    Tokens,
    /// Any step's top-1 logit differs from the golden's, bit for bit (or a token differs).
    Logits,
}

/// One flag set, replayed on every golden.
#[derive(Debug, Clone, Serialize)]
pub struct Trial {
    pub flags: Vec<String>,
    pub steps: usize,
    pub token_mismatches: usize,
    /// Largest |top-1 logit - golden top-1 logit| over steps where the tokens agree.
    pub max_abs_logit_delta: f32,
    pub diverges: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct BisectReport {
    pub criterion: Criterion,
    /// The flags searched (all the build knows, unless narrowed).
    pub searched: Vec<String>,
    /// The flag (or smallest interacting set) whose switch makes the build diverge; empty when
    /// the full set does not diverge.
    pub culprit: Vec<String>,
    pub trials: Vec<Trial>,
}

fn trial(
    spec: &Spec,
    model: &ModelId,
    goldens: &[(PathBuf, Golden)],
    flags: &[String],
    c: Criterion,
) -> Result<Trial> {
    let mut s = spec.clone();
    s.flags = Some(flags.join(","));
    let mut w = Worker::spawn(&s, model.vocab, &model.digest)?;
    let mut t = Trial {
        flags: flags.to_vec(),
        steps: 0,
        token_mismatches: 0,
        max_abs_logit_delta: 0.0,
        diverges: false,
    };
    let mut logit_bits_differ = false;
    for (_, g) in goldens {
        let steps = w.replay(&g.prompt, &g.tokens, false)?;
        for (s, gs) in steps.iter().zip(&g.steps) {
            t.steps += 1;
            if s.top[0].id != gs.top[0].id {
                t.token_mismatches += 1;
            } else {
                let d = (s.top[0].logit - gs.top[0].logit).abs();
                t.max_abs_logit_delta = t.max_abs_logit_delta.max(d);
                logit_bits_differ |= s.top[0].logit.to_bits() != gs.top[0].logit.to_bits();
            }
        }
    }
    w.shutdown();
    t.diverges = t.token_mismatches > 0 || (c == Criterion::Logits && logit_bits_differ);
    Ok(t)
}

/// Bisects `flags` (default: every flag the build knows). The build with no flags must match the
/// goldens, or there is no flag to blame.
pub fn run(
    spec: &Spec,
    model: &ModelId,
    goldens: &[(PathBuf, Golden)],
    flags: Option<Vec<String>>,
    c: Criterion,
    progress: &indicatif::ProgressBar,
) -> Result<BisectReport> {
    for (path, g) in goldens {
        g.fits(path, model)?;
        // Another model's golden diverges (or not) for reasons no flag has: refused, as the
        // gate refuses it.
        if g.model_digest != model.digest {
            bail!(
                "{}: field `model_digest` {} is not the model's {}: a golden of another model",
                path.display(),
                g.model_digest,
                model.digest
            );
        }
    }
    let searched = match flags {
        Some(f) => f,
        None => {
            let w = Worker::spawn(
                &Spec {
                    flags: Some(String::new()),
                    ..spec.clone()
                },
                model.vocab,
                &model.digest,
            )?;
            let known = w.ready.known_flags.clone();
            w.shutdown();
            known
        }
    };
    let mut rep = BisectReport {
        criterion: c,
        searched: searched.clone(),
        culprit: vec![],
        trials: vec![],
    };
    let run_trial = |set: &[String], rep: &mut BisectReport| -> Result<bool> {
        progress.set_message(format!("flags [{}]", set.join(",")));
        let t = trial(spec, model, goldens, set, c)?;
        progress.inc(1);
        let d = t.diverges;
        rep.trials.push(t);
        Ok(d)
    };
    if run_trial(&[], &mut rep)? {
        bail!(
            "the build diverges from the goldens with every flag off: the difference is not a flag"
        );
    }
    if searched.is_empty() || !run_trial(&searched, &mut rep)? {
        return Ok(rep);
    }
    let mut set = searched;
    while set.len() > 1 {
        let (a, b) = set.split_at(set.len() / 2);
        let (a, b) = (a.to_vec(), b.to_vec());
        if run_trial(&a, &mut rep)? {
            set = a;
        } else if run_trial(&b, &mut rep)? {
            set = b;
        } else {
            // Neither half alone diverges: the flags interact; report the smallest set found.
            break;
        }
    }
    rep.culprit = set;
    Ok(rep)
}
