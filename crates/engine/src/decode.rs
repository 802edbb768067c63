//! Greedy decoding: prefill, then rounds. A round with block size K verifies `[bonus, d1..d(K-1)]`
//! in one target forward and keeps the longest agreeing prefix (`docs/spec/dflash.md`); K = 1 is
//! serial decoding. Output is the target's greedy choice at every position, whatever the drafts.

use std::time::Instant;

use crate::backend::{DraftSource, TargetBackend};
use fastdecode_model::{Error, Result};

/// What a round did, for observers (tests check KV bookkeeping through this).
pub struct RoundReport<'a> {
    pub block_size: usize,
    pub accepted_drafts: usize,
    pub emitted: &'a [u32],
    pub kv_len: usize,
    /// Prompt tokens plus emitted tokens already run through the target (all but the bonus).
    pub committed: usize,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Generation {
    /// The new tokens (the first comes from the prefill).
    pub tokens: Vec<u32>,
    pub rounds: usize,
    pub accepted_drafts: usize,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    /// Of `decode_seconds`: time in the draft source's `propose` and in the target's verify
    /// forwards (host clock around each call; both return synchronised results).
    pub draft_seconds: f64,
    pub verify_seconds: f64,
    /// Whether generation ended on a stop token.
    pub stopped: bool,
}

impl Generation {
    /// Mean tokens emitted per round (accepted drafts + 1).
    pub fn tokens_per_round(&self) -> f64 {
        if self.rounds == 0 {
            0.0
        } else {
            (self.rounds + self.accepted_drafts) as f64 / self.rounds as f64
        }
    }
}

pub struct DecodeOptions<'a> {
    pub max_new_tokens: usize,
    /// 1 = serial.
    pub block_size: usize,
    pub stop_tokens: &'a [u32],
}

/// The caller's draft source, else (`resident`) the target's own, else none.
fn pick_source<'a>(
    source: &'a mut Option<&mut dyn DraftSource>,
    target: &'a mut dyn TargetBackend,
    resident: bool,
) -> Option<&'a mut dyn DraftSource> {
    match source {
        Some(s) => Some(&mut **s),
        None if resident => target.resident_drafter(),
        None => None,
    }
}

/// Prefill `prompt`, then decode greedily. `source` is required when `block_size > 1`.
pub fn generate(
    target: &mut dyn TargetBackend,
    source: Option<&mut dyn DraftSource>,
    prompt: &[u32],
    opts: &DecodeOptions,
    on_round: &mut dyn FnMut(&RoundReport),
) -> Result<Generation> {
    generate_observed(target, source, prompt, opts, &mut |_, _| {}, on_round)
}

/// `generate`, also telling `on_prefill(first token, kv_len)` as soon as the prefill has chosen
/// the first token: a worker reports it there, so the parent's clock can split a timed window
/// into its prefill and decode parts.
pub fn generate_observed(
    target: &mut dyn TargetBackend,
    mut source: Option<&mut dyn DraftSource>,
    prompt: &[u32],
    opts: &DecodeOptions,
    on_prefill: &mut dyn FnMut(u32, usize),
    on_round: &mut dyn FnMut(&RoundReport),
) -> Result<Generation> {
    let k_max = opts.block_size;
    if prompt.is_empty() {
        return Err(Error::Input(
            "the prompt must have at least one token".into(),
        ));
    }
    if k_max == 0 || k_max > fastdecode_model::config::MAX_BLOCK_SIZE {
        return Err(Error::Input(format!(
            "block size {k_max} is outside 1..={}",
            fastdecode_model::config::MAX_BLOCK_SIZE
        )));
    }
    // Without a source of its own, DFlash uses the target's resident drafter (on its device).
    let resident = k_max > 1 && source.is_none();
    if resident && target.resident_drafter().is_none() {
        return Err(Error::Input("block size > 1 needs a draft source".into()));
    }
    // Every length is checked against the model and the machine before anything is allocated.
    crate::limits::check_length(target.config(), prompt.len(), opts.max_new_tokens)?;
    target.check_capacity(prompt.len() + opts.max_new_tokens, prompt.len())?;
    // The source of this run, borrowed anew for each call (a resident one lives in `target`).
    macro_rules! source {
        () => {
            pick_source(&mut source, &mut *target, resident)
        };
    }
    let vocab = target.config().vocab_size;
    let taps: Vec<usize> = source!()
        .map(|s| s.tap_layers().to_vec())
        .unwrap_or_default();
    target.reset();
    if let Some(s) = source!() {
        s.reset();
    }
    let mut g = Generation::default();
    if opts.max_new_tokens == 0 {
        return Ok(g);
    }
    let t0 = Instant::now();
    let positions: Vec<usize> = (0..prompt.len()).collect();
    let out = target.forward_greedy(prompt, &positions, &taps, true)?;
    let mut bonus = out.tokens[0];
    if let Some(s) = source!() {
        s.commit(&out.taps, prompt.len())?;
    }
    g.prefill_seconds = t0.elapsed().as_secs_f64();
    on_prefill(bonus, target.kv_len());
    let t1 = Instant::now();
    g.tokens.push(bonus);
    g.stopped = opts.stop_tokens.contains(&bonus);
    if k_max == 1 && taps.is_empty() && !g.stopped {
        // Serial decoding without a draft source is one call, which a GPU backend pipelines;
        // every step is reported as the one-row round it is.
        let o = target.kv_len();
        let steps = opts.max_new_tokens - g.tokens.len();
        let tv = Instant::now();
        let tokens = &mut g.tokens;
        let made = target.serial_greedy(bonus, steps, opts.stop_tokens, &mut |t| {
            tokens.push(t);
            let emitted = [t];
            on_round(&RoundReport {
                block_size: 1,
                accepted_drafts: 0,
                emitted: &emitted,
                kv_len: o + tokens.len() - 1,
                committed: prompt.len() + tokens.len() - 1,
            });
        })?;
        g.verify_seconds += tv.elapsed().as_secs_f64();
        g.rounds += made;
        g.stopped = g
            .tokens
            .last()
            .is_some_and(|t| opts.stop_tokens.contains(t));
    }
    while g.tokens.len() < opts.max_new_tokens && !g.stopped {
        let o = target.kv_len();
        // No point verifying rows past the requested length; output is the same either way.
        let k = k_max.min(opts.max_new_tokens - g.tokens.len());
        let mut rows = vec![bonus];
        if k > 1 {
            let s = source!().expect("checked above");
            let td = Instant::now();
            let drafts = s.propose(bonus, o, k)?;
            g.draft_seconds += td.elapsed().as_secs_f64();
            if drafts.len() != k - 1 || drafts.iter().any(|&d| d as usize >= vocab) {
                return Err(Error::Input(format!(
                    "draft source returned {} tokens for a block of {k}, or a token outside the vocabulary",
                    drafts.len()
                )));
            }
            rows.extend(drafts);
        }
        let positions: Vec<usize> = (o..o + k).collect();
        let tv = Instant::now();
        let out = target.forward_greedy(&rows, &positions, &taps, false)?;
        g.verify_seconds += tv.elapsed().as_secs_f64();
        let choices = out.tokens;
        let mut a = 0;
        while a + 1 < k && rows[a + 1] == choices[a] {
            a += 1;
        }
        let mut emitted = &choices[..=a];
        if let Some(stop_at) = emitted.iter().position(|t| opts.stop_tokens.contains(t)) {
            emitted = &emitted[..=stop_at];
            g.stopped = true;
        }
        // Rows 0..emitted.len() are now committed; the rest leave the cache.
        let kept = emitted.len();
        target.truncate(o + kept);
        let per_row = taps.len() * target.config().hidden_size;
        if let Some(s) = source!() {
            // A resident drafter took the taps on the device: none came back.
            let host = out.taps.get(..kept * per_row).unwrap_or(&[]);
            s.commit(host, kept)?;
        }
        g.tokens.extend_from_slice(emitted);
        g.rounds += 1;
        g.accepted_drafts += a;
        bonus = choices[a];
        on_round(&RoundReport {
            block_size: k,
            accepted_drafts: a,
            emitted,
            kv_len: target.kv_len(),
            committed: prompt.len() + g.tokens.len() - 1,
        });
    }
    g.decode_seconds = t1.elapsed().as_secs_f64();
    Ok(g)
}
