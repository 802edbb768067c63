//! Making goldens: a live process of the reference build decodes the prompt greedily, then replays
//! its own continuation teacher-forced for the per-step top-2; the degeneracy screen decides
//! whether the prompt makes a useful golden.

use anyhow::{bail, Result};

use fastdecode_worker::protocol::WindowRequest;
use fastdecode_worker::{ModelId, NoTick, Worker};

use crate::golden::{screen, Golden, GoldenStep, MadeBy, ScreenParams, FORMAT, VERSION};

/// A golden for `prompt` with `tokens` greedy tokens, or the screen's reason to reject it.
pub fn make_one(
    reference: &mut Worker,
    model: &ModelId,
    prompt: &[u32],
    tokens: usize,
    params: &ScreenParams,
) -> Result<std::result::Result<Golden, String>> {
    if tokens == 0 {
        bail!("a golden needs at least one token");
    }
    let w = reference.window(WindowRequest::serial(prompt, tokens - 1), &mut NoTick)?;
    let steps = reference.replay(prompt, &w.tokens, false)?;
    if let Some(i) = steps
        .iter()
        .zip(&w.tokens)
        .position(|(s, &t)| s.top[0].id != t)
    {
        bail!(
            "the reference's teacher-forced replay disagrees with its own greedy decoding at step {i}: \
             the build is not batch-invariant, so it cannot make goldens"
        );
    }
    let steps: Vec<GoldenStep> = steps
        .into_iter()
        .map(|s| GoldenStep { top: s.top })
        .collect();
    let (stats, verdict) = screen(&w.tokens, &steps, params);
    if let Err(why) = verdict {
        return Ok(Err(why));
    }
    let r = &reference.ready;
    Ok(Ok(Golden {
        format: FORMAT.into(),
        version: VERSION,
        model_digest: model.digest.clone(),
        vocab_size: model.vocab,
        prompt: prompt.to_vec(),
        tokens: w.tokens,
        steps,
        made_by: MadeBy {
            build: r.build.clone(),
            backend: r.backend.clone(),
            flags: r.flags.clone(),
        },
        screen: stats,
    }))
}
