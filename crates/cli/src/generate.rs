//! `fastdecode generate`: greedy text generation, serial or DFlash.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde_json::json;

use fastdecode_engine::model_dir::default_model_dir;
use fastdecode_engine::model_dir::Needs;
use fastdecode_engine::session::{dflash, serial};
use fastdecode_engine::{DraftPlan, DraftSpec, Generation, LoadedModel};

use crate::common::{at_least, between, check_fits, check_ids, MAX_BLOCK};

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Backend {
    /// The f32 reference engine (any machine).
    Cpu,
    /// The GPU engine (NVIDIA, CUDA driver and NVRTC at run time).
    Cuda,
}

#[derive(Args)]
pub struct GenerateArgs {
    /// Model directory; the bundled default model when omitted.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Prompt text (needs the model's tokenizer.json).
    #[arg(
        long,
        allow_hyphen_values = true,
        conflicts_with = "prompt_ids",
        required_unless_present = "prompt_ids"
    )]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids, e.g. 1,2,3.
    #[arg(long, allow_hyphen_values = true, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Number of new tokens (fewer if an end-of-sequence token comes first).
    #[arg(long, allow_negative_numbers = true, default_value_t = 64, value_parser = at_least(1))]
    max_new_tokens: usize,
    /// DFlash block size K (1 = serial decoding; at most the drafter's block size, 16 for the oracle).
    #[arg(long, allow_negative_numbers = true, default_value_t = 1, value_parser = between(1, MAX_BLOCK))]
    block_size: usize,
    /// DFlash draft source: `drafter` (the model's drafter/) or `oracle:P` (the true greedy token
    /// with probability P, else a wrong one).
    #[arg(long, default_value = "drafter")]
    draft: DraftSpec,
    /// Seed of the oracle's coin flips.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    seed: u64,
    /// Also run serial decoding, check the outputs are identical and report both speeds.
    #[arg(long)]
    compare: bool,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    #[arg(long, value_enum, default_value = "cpu")]
    backend: Backend,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

fn stats(label: &str, g: &Generation) -> String {
    let n = g.tokens.len();
    let tps = if g.decode_seconds > 0.0 {
        (n.saturating_sub(1)) as f64 / g.decode_seconds
    } else {
        0.0
    };
    let mut s = format!(
        "{label}: {n} tokens, prefill {:.1} ms, decode {:.1} tokens/s",
        g.prefill_seconds * 1e3,
        tps
    );
    if g.accepted_drafts > 0 || label != "serial" {
        s += &format!(
            ", {} rounds, {} accepted drafts, {:.2} tokens per round",
            g.rounds,
            g.accepted_drafts,
            g.tokens_per_round()
        );
    }
    s
}

fn gen_json(g: &Generation) -> serde_json::Value {
    let n = g.tokens.len();
    json!({
        "rounds": g.rounds,
        "accepted_drafts": g.accepted_drafts,
        "tokens_per_round": g.tokens_per_round(),
        "prefill_ms": g.prefill_seconds * 1e3,
        "decode_tokens_per_s": if g.decode_seconds > 0.0 { (n.saturating_sub(1)) as f64 / g.decode_seconds } else { 0.0 },
    })
}

pub fn run(a: GenerateArgs) -> Result<()> {
    let dir = match a.model {
        Some(d) => d,
        None => default_model_dir()?,
    };
    // The CPU model is the engine of the CPU backend and the drafter's host; a large model on the
    // GPU must not be expanded to f32 in host memory just to read its config and tokenizer.
    fastdecode_engine::model_dir::require_config(&dir)?;
    let uses_drafter = a.block_size > 1 && matches!(a.draft, DraftSpec::Drafter);
    // Optional parts this run does not need (a drafter for a serial run, a tokenizer for
    // --prompt-ids) are left out with a note when they are broken, instead of stopping the run.
    let needs = Needs {
        drafter: uses_drafter,
        tokenizer: a.prompt.is_some(),
    };
    // The CPU model is only the CPU backend's: on the GPU the drafter runs there too, beside the
    // target, fed its tapped hidden states on the device.
    let model = if a.backend == Backend::Cpu {
        Some(LoadedModel::load_for(&dir, needs)?)
    } else {
        None
    };
    let cfg = match &model {
        Some(m) => m.target.cfg.clone(),
        None => fastdecode_model::LagunaConfig::from_file(&dir.join("config.json"))?,
    };
    let mut ignored = model
        .as_ref()
        .map(|m| m.ignored.clone())
        .unwrap_or_default();
    let tp = dir.join("tokenizer.json");
    let own_tokenizer = match &model {
        Some(_) => None,
        None if tp.symlink_metadata().is_ok() => {
            match fastdecode_engine::tokenizer::TextTokenizer::load(&tp, cfg.vocab_size) {
                Ok(t) => Some(t),
                Err(e) if !needs.tokenizer => {
                    ignored.push(format!("{e}; not needed by this run, so it is left out"));
                    None
                }
                Err(e) => return Err(e.into()),
            }
        }
        None => None,
    };
    for note in &ignored {
        eprintln!("note: {note}");
    }
    let tokenizer = model
        .as_ref()
        .and_then(|m| m.tokenizer.as_ref())
        .or(own_tokenizer.as_ref());
    let prompt = match (&a.prompt, &a.prompt_ids) {
        (Some(text), _) => {
            let ids = tokenizer
                .as_ref()
                .with_context(|| format!("{}: no tokenizer.json; use --prompt-ids", dir.display()))?
                .encode(text)?;
            check_ids(&ids, cfg.vocab_size, "--prompt")?;
            ids
        }
        (None, Some(ids)) => {
            check_ids(ids, cfg.vocab_size, "--prompt-ids")?;
            ids.clone()
        }
        (None, None) => bail!("give --prompt or --prompt-ids"),
    };
    check_fits(
        &cfg,
        &dir,
        prompt.len(),
        a.max_new_tokens,
        "--max-new-tokens",
    )?;
    let stop: Vec<u32> = if a.ignore_eos {
        vec![]
    } else {
        cfg.eos_token_ids.clone()
    };
    let mut gpu = match a.backend {
        Backend::Cuda => {
            let g = fastdecode_engine::cuda_backend::CudaBackend::open_dir(
                &dir,
                a.block_size,
                prompt.len() + a.max_new_tokens + 16,
                uses_drafter,
            )?;
            if uses_drafter && !g.has_drafter() {
                bail!(
                    "{}: this model has no drafter/ (use --draft oracle:P)",
                    dir.display()
                );
            }
            Some(g)
        }
        Backend::Cpu => None,
    };
    let need_serial = a.block_size == 1 || a.compare || matches!(a.draft, DraftSpec::Oracle(_));
    let serial_run = match (need_serial, &mut gpu) {
        (false, _) => None,
        (true, None) => Some(serial(
            model.as_ref().expect("loaded for the CPU backend"),
            &prompt,
            a.max_new_tokens,
            &stop,
        )?),
        (true, Some(g)) => Some(fastdecode_engine::session::run(
            g,
            None,
            &prompt,
            a.max_new_tokens,
            1,
            &stop,
        )?),
    };
    let dflash_run = if a.block_size > 1 {
        let plan = DraftPlan {
            block_size: a.block_size,
            source: a.draft,
            seed: a.seed,
        };
        let truth = serial_run.as_ref().map(|g| g.tokens.as_slice());
        let g = match &mut gpu {
            None => dflash(
                model.as_ref().expect("loaded for the CPU backend"),
                &prompt,
                a.max_new_tokens,
                &stop,
                plan,
                truth,
            )?,
            Some(g) => {
                // The drafter source is the GPU target's resident drafter (no source passed).
                let mut oracle = match plan.source {
                    DraftSpec::Oracle(_) => Some(fastdecode_engine::session::oracle_source(
                        cfg.vocab_size,
                        &prompt,
                        plan,
                        truth,
                    )?),
                    DraftSpec::Drafter => None,
                };
                if let (DraftSpec::Drafter, Some(max)) = (plan.source, g.drafter_block_size()) {
                    if a.block_size > max {
                        bail!(
                            "--block-size {} is above the drafter's maximum {max}",
                            a.block_size
                        );
                    }
                }
                fastdecode_engine::session::run(
                    g,
                    oracle
                        .as_mut()
                        .map(|s| s.as_mut() as &mut dyn fastdecode_engine::DraftSource),
                    &prompt,
                    a.max_new_tokens,
                    a.block_size,
                    &stop,
                )?
            }
        };
        if let Some(s) = &serial_run {
            if s.tokens != g.tokens {
                bail!("DFlash output differs from serial output: this is a bug, please report it");
            }
        }
        Some(g)
    } else {
        None
    };
    let main = dflash_run
        .as_ref()
        .or(serial_run.as_ref())
        .expect("one run happened");
    let text = tokenizer
        .as_ref()
        .map(|t| t.decode(&main.tokens))
        .transpose()?;
    if let Some(t) = tokenizer {
        let unknown = t.unknown(&main.tokens);
        if unknown > 0 {
            eprintln!(
                "note: {unknown} of the {} generated tokens have no entry in {} (its vocabulary \
                 is smaller than the model's); the text leaves them out",
                main.tokens.len(),
                t.path().display()
            );
        }
    }
    // Text that decodes to nothing (special or unknown tokens only) is no answer: the ids are.
    let text = text.filter(|t| !t.is_empty() || main.tokens.is_empty());
    if text.is_none() && tokenizer.is_some() {
        eprintln!("note: the generated tokens decode to no text; printing their ids");
    }
    if a.json {
        let mut out = json!({
            "model": dir.display().to_string(),
            "prompt_tokens": prompt.len(),
            "tokens": main.tokens,
            "block_size": a.block_size,
            "rounds": main.rounds,
            "accepted_drafts": main.accepted_drafts,
            "stopped_at_eos": main.stopped,
        });
        if let Some(t) = &text {
            out["text"] = json!(t);
        }
        if a.block_size > 1 {
            out["draft"] = json!(a.draft.to_string());
            out["dflash"] = gen_json(dflash_run.as_ref().expect("block size > 1"));
        }
        if let Some(s) = &serial_run {
            out["serial"] = gen_json(s);
        }
        outln!("{}", serde_json::to_string_pretty(&out)?)?;
        return Ok(());
    }
    match &text {
        Some(t) => outln!("{t}")?,
        None => outln!(
            "{}",
            main.tokens
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        )?,
    }
    if main.stopped {
        eprintln!(
            "note: stopped at an end-of-sequence token after {} of the {} new tokens asked for \
             (--ignore-eos goes on past it)",
            main.tokens.len(),
            a.max_new_tokens
        );
    }
    if let Some(s) = &serial_run {
        eprintln!("{}", stats("serial", s));
    }
    if let Some(d) = &dflash_run {
        eprintln!(
            "{}",
            stats(&format!("dflash K={} {}", a.block_size, a.draft), d)
        );
        if let Some(s) = &serial_run {
            eprintln!(
                "identical output; DFlash decode speed-up {:.2}x{}",
                s.decode_seconds / d.decode_seconds.max(1e-12),
                match a.backend {
                    // Why a CPU shows a slow-down: its verify is compute-bound, a GPU's is not.
                    Backend::Cpu => format!(
                        " (on a CPU a verify of K rows costs about K one-row forwards, so DFlash \
                         cannot gain here; its {:.2} tokens a round are what a GPU, which reads \
                         the weights once for all K rows, turns into speed)",
                        d.tokens_per_round()
                    ),
                    Backend::Cuda => String::new(),
                }
            );
        }
    }
    Ok(())
}
