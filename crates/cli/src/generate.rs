//! `fastdecode generate`: greedy text generation, serial or DFlash.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde_json::json;

use fastdecode_engine::cuda_backend::CudaBackend;
use fastdecode_engine::model_dir::default_model_dir;
use fastdecode_engine::model_dir::Needs;
use fastdecode_engine::session::{dflash, serial};
use fastdecode_engine::tokenizer::TextTokenizer;
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
    let dir = match &a.model {
        Some(d) => d.clone(),
        None => default_model_dir()?,
    };
    let uses_drafter = a.block_size > 1 && matches!(a.draft, DraftSpec::Drafter);
    let host = Host::load(&dir, &a, uses_drafter)?;
    let prompt = prompt_ids(&a, &dir, host.cfg.vocab_size, host.tokenizer())?;
    check_fits(
        &host.cfg,
        &dir,
        prompt.len(),
        a.max_new_tokens,
        "--max-new-tokens",
    )?;
    let stop: Vec<u32> = if a.ignore_eos {
        vec![]
    } else {
        host.cfg.eos_token_ids.clone()
    };
    let mut gpu = open_gpu(&a, &dir, prompt.len(), uses_drafter)?;
    let job = Job {
        prompt: &prompt,
        max_new_tokens: a.max_new_tokens,
        stop: &stop,
        vocab_size: host.cfg.vocab_size,
    };
    let runs = decode(&a, host.model.as_ref(), gpu.as_mut(), &job)?;
    report(&a, &dir, prompt.len(), &runs, host.tokenizer())
}

/// The parts of the model this process holds: the whole CPU model for the CPU backend, else only
/// its config and tokenizer.
struct Host {
    /// The engine of the CPU backend and the drafter's host; on the GPU the drafter runs there
    /// too, beside the target, fed its tapped hidden states on the device.
    model: Option<LoadedModel>,
    cfg: fastdecode_model::LagunaConfig,
    /// The tokenizer when there is no CPU model to hold it.
    own_tokenizer: Option<TextTokenizer>,
}

impl Host {
    /// Loads what the backend needs and prints a note for each optional part left out.
    fn load(dir: &Path, a: &GenerateArgs, uses_drafter: bool) -> Result<Host> {
        // A large model on the GPU must not be expanded to f32 in host memory just to read its
        // config and tokenizer.
        fastdecode_engine::model_dir::require_config(dir)?;
        // Optional parts this run does not need (a drafter for a serial run, a tokenizer for
        // --prompt-ids) are left out with a note when they are broken, instead of stopping the run.
        let needs = Needs {
            drafter: uses_drafter,
            tokenizer: a.prompt.is_some(),
        };
        let model = if a.backend == Backend::Cpu {
            Some(LoadedModel::load_for(dir, needs)?)
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
                match TextTokenizer::load(&tp, cfg.vocab_size) {
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
        Ok(Host {
            model,
            cfg,
            own_tokenizer,
        })
    }

    fn tokenizer(&self) -> Option<&TextTokenizer> {
        self.model
            .as_ref()
            .and_then(|m| m.tokenizer.as_ref())
            .or(self.own_tokenizer.as_ref())
    }
}

/// The prompt's token ids, from --prompt (encoded) or --prompt-ids, checked against the vocabulary.
fn prompt_ids(
    a: &GenerateArgs,
    dir: &Path,
    vocab_size: usize,
    tokenizer: Option<&TextTokenizer>,
) -> Result<Vec<u32>> {
    Ok(match (&a.prompt, &a.prompt_ids) {
        (Some(text), _) => {
            let ids = tokenizer
                .with_context(|| format!("{}: no tokenizer.json; use --prompt-ids", dir.display()))?
                .encode(text)?;
            check_ids(&ids, vocab_size, "--prompt")?;
            ids
        }
        (None, Some(ids)) => {
            check_ids(ids, vocab_size, "--prompt-ids")?;
            ids.clone()
        }
        (None, None) => bail!("give --prompt or --prompt-ids"),
    })
}

/// The GPU engine for the CUDA backend (none for the CPU's), sized for the prompt and the new
/// tokens, with the drafter when it drafts.
fn open_gpu(
    a: &GenerateArgs,
    dir: &Path,
    prompt_len: usize,
    uses_drafter: bool,
) -> Result<Option<CudaBackend>> {
    if a.backend == Backend::Cpu {
        return Ok(None);
    }
    let g = CudaBackend::open_dir(
        dir,
        a.block_size,
        prompt_len + a.max_new_tokens + 16,
        uses_drafter,
    )?;
    if uses_drafter && !g.has_drafter() {
        bail!(
            "{}: this model has no drafter/ (use --draft oracle:P)",
            dir.display()
        );
    }
    Ok(Some(g))
}

/// What every decoding of this run shares.
struct Job<'a> {
    prompt: &'a [u32],
    max_new_tokens: usize,
    stop: &'a [u32],
    vocab_size: usize,
}

/// Serial decoding when it is asked for or needed (it is the oracle's truth), DFlash when the
/// block size is above 1.
fn decode(
    a: &GenerateArgs,
    model: Option<&LoadedModel>,
    mut gpu: Option<&mut CudaBackend>,
    job: &Job,
) -> Result<Runs> {
    let need_serial = a.block_size == 1 || a.compare || matches!(a.draft, DraftSpec::Oracle(_));
    let serial = if need_serial {
        Some(run_serial(model, gpu.as_deref_mut(), job)?)
    } else {
        None
    };
    let dflash = if a.block_size > 1 {
        let plan = DraftPlan {
            block_size: a.block_size,
            source: a.draft,
            seed: a.seed,
        };
        Some(run_dflash(model, gpu, job, plan, serial.as_ref())?)
    } else {
        None
    };
    Ok(Runs { serial, dflash })
}

/// Serial decoding on the GPU when it is open, else on the CPU model.
fn run_serial(
    model: Option<&LoadedModel>,
    gpu: Option<&mut CudaBackend>,
    job: &Job,
) -> Result<Generation> {
    Ok(match gpu {
        None => serial(
            model.expect("loaded for the CPU backend"),
            job.prompt,
            job.max_new_tokens,
            job.stop,
        )?,
        Some(g) => {
            fastdecode_engine::session::run(g, None, job.prompt, job.max_new_tokens, 1, job.stop)?
        }
    })
}

/// DFlash decoding on the GPU when it is open, else on the CPU model, checked token for token
/// against the serial run when there is one (also the oracle's truth).
fn run_dflash(
    model: Option<&LoadedModel>,
    gpu: Option<&mut CudaBackend>,
    job: &Job,
    plan: DraftPlan,
    serial_run: Option<&Generation>,
) -> Result<Generation> {
    let truth = serial_run.map(|g| g.tokens.as_slice());
    let g = match gpu {
        None => dflash(
            model.expect("loaded for the CPU backend"),
            job.prompt,
            job.max_new_tokens,
            job.stop,
            plan,
            truth,
        )?,
        Some(g) => dflash_on_gpu(g, job, plan, truth)?,
    };
    if let Some(s) = serial_run {
        if s.tokens != g.tokens {
            bail!("DFlash output differs from serial output: this is a bug, please report it");
        }
    }
    Ok(g)
}

fn dflash_on_gpu(
    g: &mut CudaBackend,
    job: &Job,
    plan: DraftPlan,
    truth: Option<&[u32]>,
) -> Result<Generation> {
    // The drafter source is the GPU target's resident drafter (no source passed).
    let mut oracle = match plan.source {
        DraftSpec::Oracle(_) => Some(fastdecode_engine::session::oracle_source(
            job.vocab_size,
            job.prompt,
            plan,
            truth,
        )?),
        DraftSpec::Drafter => None,
    };
    if let (DraftSpec::Drafter, Some(max)) = (plan.source, g.drafter_block_size()) {
        if plan.block_size > max {
            bail!(
                "--block-size {} is above the drafter's maximum {max}",
                plan.block_size
            );
        }
    }
    Ok(fastdecode_engine::session::run(
        g,
        oracle
            .as_mut()
            .map(|s| s.as_mut() as &mut dyn fastdecode_engine::DraftSource),
        job.prompt,
        job.max_new_tokens,
        plan.block_size,
        job.stop,
    )?)
}

/// The runs made: serial, DFlash, or both (--compare, or the oracle's truth).
struct Runs {
    serial: Option<Generation>,
    dflash: Option<Generation>,
}

impl Runs {
    /// The run whose tokens are the answer: DFlash's when it ran.
    fn main(&self) -> &Generation {
        self.dflash
            .as_ref()
            .or(self.serial.as_ref())
            .expect("one run happened")
    }
}

/// The answer on stdout (text, or the ids when there is no text), notes and speeds on stderr;
/// or one JSON object with --json.
fn report(
    a: &GenerateArgs,
    dir: &Path,
    prompt_len: usize,
    runs: &Runs,
    tokenizer: Option<&TextTokenizer>,
) -> Result<()> {
    let text = answer_text(runs.main(), tokenizer)?;
    if a.json {
        return print_json(a, dir, prompt_len, runs, text.as_deref());
    }
    let main = runs.main();
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
    print_speeds(a, runs);
    Ok(())
}

/// The generated tokens as text, with a note for tokens the tokenizer lacks; none when there is
/// no tokenizer or the text is empty.
fn answer_text(main: &Generation, tokenizer: Option<&TextTokenizer>) -> Result<Option<String>> {
    let text = tokenizer.map(|t| t.decode(&main.tokens)).transpose()?;
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
    Ok(text)
}

fn print_json(
    a: &GenerateArgs,
    dir: &Path,
    prompt_len: usize,
    runs: &Runs,
    text: Option<&str>,
) -> Result<()> {
    let main = runs.main();
    let mut out = json!({
        "model": dir.display().to_string(),
        "prompt_tokens": prompt_len,
        "tokens": main.tokens,
        "block_size": a.block_size,
        "rounds": main.rounds,
        "accepted_drafts": main.accepted_drafts,
        "stopped_at_eos": main.stopped,
    });
    if let Some(t) = text {
        out["text"] = json!(t);
    }
    if a.block_size > 1 {
        out["draft"] = json!(a.draft.to_string());
        out["dflash"] = gen_json(runs.dflash.as_ref().expect("block size > 1"));
    }
    if let Some(s) = &runs.serial {
        out["serial"] = gen_json(s);
    }
    outln!("{}", serde_json::to_string_pretty(&out)?)?;
    Ok(())
}

/// Each run's speeds on stderr, and DFlash's speed-up when serial ran too.
fn print_speeds(a: &GenerateArgs, runs: &Runs) {
    if let Some(s) = &runs.serial {
        eprintln!("{}", stats("serial", s));
    }
    let Some(d) = &runs.dflash else {
        return;
    };
    eprintln!(
        "{}",
        stats(&format!("dflash K={} {}", a.block_size, a.draft), d)
    );
    if let Some(s) = &runs.serial {
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
