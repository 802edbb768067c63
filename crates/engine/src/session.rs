//! Ready-made decode runs over a loaded CPU model: serial, or DFlash with a named draft source.

use std::str::FromStr;

use fastdecode_model::{Error, Result};

use crate::backend::{CpuDrafter, CpuTarget, DraftSource, TargetBackend};
use crate::decode::{generate, DecodeOptions, Generation};
use crate::model_dir::LoadedModel;
use crate::oracle::Oracle;

/// Where DFlash drafts come from: `drafter` (the model's trained drafter) or `oracle:P`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DraftSpec {
    Drafter,
    Oracle(f64),
}

impl FromStr for DraftSpec {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s == "drafter" {
            return Ok(DraftSpec::Drafter);
        }
        if let Some(p) = s.strip_prefix("oracle:") {
            let p: f64 = p
                .parse()
                .map_err(|_| format!("oracle probability {p:?} is not a number"))?;
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("oracle probability {p} is not in [0, 1]"));
            }
            return Ok(DraftSpec::Oracle(p));
        }
        Err(format!(
            "unknown draft source {s:?} (expected drafter or oracle:P)"
        ))
    }
}

impl std::fmt::Display for DraftSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DraftSpec::Drafter => write!(f, "drafter"),
            DraftSpec::Oracle(p) => write!(f, "oracle:{p}"),
        }
    }
}

/// Largest block any source here supports: the drafter's trained block size, 16 for the oracle.
pub fn max_block(model: &LoadedModel, spec: DraftSpec) -> usize {
    match (spec, &model.drafter) {
        (DraftSpec::Drafter, Some(d)) => d.cfg.block_size,
        _ => fastdecode_model::config::MAX_BLOCK_SIZE,
    }
}

/// Greedy decoding of `prompt` on any target: serial without a source, DFlash with one.
pub fn run(
    target: &mut dyn TargetBackend,
    source: Option<&mut dyn DraftSource>,
    prompt: &[u32],
    max_new: usize,
    block_size: usize,
    stop: &[u32],
) -> Result<Generation> {
    let opts = DecodeOptions {
        max_new_tokens: max_new,
        block_size,
        stop_tokens: stop,
    };
    generate(target, source, prompt, &opts, &mut |_| {})
}

pub fn serial(
    model: &LoadedModel,
    prompt: &[u32],
    max_new: usize,
    stop: &[u32],
) -> Result<Generation> {
    let mut t = CpuTarget::new(model.target.clone(), 1);
    run(&mut t, None, prompt, max_new, 1, stop)
}

/// How a DFlash run drafts: block size, source, and the oracle's seed.
#[derive(Debug, Clone, Copy)]
pub struct DraftPlan {
    pub block_size: usize,
    pub source: DraftSpec,
    pub seed: u64,
}

/// DFlash per `plan`. The oracle needs `truth`: the serial greedy tokens of this prompt.
pub fn dflash(
    model: &LoadedModel,
    prompt: &[u32],
    max_new: usize,
    stop: &[u32],
    plan: DraftPlan,
    truth: Option<&[u32]>,
) -> Result<Generation> {
    let k = plan.block_size;
    let mut source = draft_source(model, prompt, plan, truth)?;
    let mut t = CpuTarget::new(model.target.clone(), k);
    run(&mut t, Some(source.as_mut()), prompt, max_new, k, stop)
}

/// The draft source `plan` names, checked against its maximum block size. The oracle needs
/// `truth`: the serial greedy tokens of `prompt`.
pub fn draft_source(
    model: &LoadedModel,
    prompt: &[u32],
    plan: DraftPlan,
    truth: Option<&[u32]>,
) -> Result<Box<dyn DraftSource>> {
    let (k, spec) = (plan.block_size, plan.source);
    match spec {
        DraftSpec::Drafter => {
            if k > max_block(model, spec) {
                return Err(Error::Input(format!(
                    "block size {k} is above the {spec} source's maximum {}",
                    max_block(model, spec)
                )));
            }
            let d = model.drafter.as_ref().ok_or_else(|| {
                Error::Input(format!(
                    "{}: this model has no drafter/ (use --draft oracle:P)",
                    model.dir.display()
                ))
            })?;
            Ok(Box::new(CpuDrafter::new(model.target.clone(), d.clone())?))
        }
        DraftSpec::Oracle(_) => oracle_source(model.target.cfg.vocab_size, prompt, plan, truth),
    }
}

/// The `oracle:P` source of `plan`, realised from `truth` (the serial greedy tokens of
/// `prompt`): it needs only the vocabulary size, no model in host memory (a GPU target runs it
/// beside a model too large for the CPU engine).
pub fn oracle_source(
    vocab_size: usize,
    prompt: &[u32],
    plan: DraftPlan,
    truth: Option<&[u32]>,
) -> Result<Box<dyn DraftSource>> {
    let p = oracle_p(plan)?;
    let truth =
        truth.ok_or_else(|| Error::Input("the oracle needs the serial greedy tokens".into()))?;
    Ok(Box::new(Oracle::new(
        truth,
        prompt.len(),
        p,
        vocab_size,
        plan.seed,
    )?))
}

/// The `oracle:P` source of `plan` from drafts its parent realised (`oracle::realise`), one per
/// position after `prompt`: what a worker runs, never seeing the truth itself.
pub fn drafts_source(
    prompt: &[u32],
    plan: DraftPlan,
    drafts: &[u32],
) -> Result<Box<dyn DraftSource>> {
    oracle_p(plan)?;
    Ok(Box::new(Oracle::from_drafts(drafts.to_vec(), prompt.len())))
}

/// The oracle's probability, when `plan` names the oracle at a block size it takes.
fn oracle_p(plan: DraftPlan) -> Result<f64> {
    let (k, spec) = (plan.block_size, plan.source);
    let DraftSpec::Oracle(p) = spec else {
        return Err(Error::Input(format!("{spec} is not the oracle source")));
    };
    // The oracle's bound is `max_block`'s for it, which depends on no model.
    let max = fastdecode_model::config::MAX_BLOCK_SIZE;
    if k > max {
        return Err(Error::Input(format!(
            "block size {k} is above the {spec} source's maximum {max}"
        )));
    }
    Ok(p)
}
