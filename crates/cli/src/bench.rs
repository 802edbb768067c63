//! `fastdecode bench`: prefill and decode speed, serial and DFlash, and draft acceptance.
//! Every DFlash run is checked token for token against the serial run of the same prompt.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use rand::{Rng, SeedableRng};
use serde_json::json;

use fastdecode_engine::model_dir::{default_model_dir, Needs};
use fastdecode_engine::session::{dflash, max_block, serial};
use fastdecode_engine::traces;
use fastdecode_engine::{DraftPlan, DraftSpec, Generation, LoadedModel};
use fastdecode_model::manifest;

use crate::common::{at_least, between, check_fits, check_ids, MAX_BLOCK};
use crate::generate::Backend;

#[derive(Args)]
pub struct BenchArgs {
    #[arg(long, value_enum, default_value = "cpu")]
    backend: Backend,
    /// Model directory; the bundled default model when omitted.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Prompt length when prompts are random token ids (no --prompts).
    #[arg(long, allow_negative_numbers = true, default_value_t = 64, value_parser = at_least(1))]
    prompt_tokens: usize,
    /// Prompts: a text file, one per line (needs the model's tokenizer), or a `.json` traces file
    /// (`prompts[].prompt_ids`, e.g. assets/traces/); default: one random prompt.
    #[arg(long)]
    prompts: Option<PathBuf>,
    /// Use at most this many prompts from --prompts.
    #[arg(long, allow_negative_numbers = true, default_value_t = 20, value_parser = at_least(1))]
    max_prompts: usize,
    /// New tokens per prompt (end-of-sequence tokens are ignored so every run has this length).
    #[arg(long, allow_negative_numbers = true, default_value_t = 128, value_parser = at_least(2))]
    decode_tokens: usize,
    /// DFlash block sizes to measure (each 2 to 16); default: the drafter's block size (8 for the oracle).
    #[arg(long, allow_negative_numbers = true, value_delimiter = ',', value_parser = between(2, MAX_BLOCK))]
    block_sizes: Option<Vec<usize>>,
    /// DFlash draft source: `drafter` or `oracle:P`.
    #[arg(long, default_value = "drafter")]
    draft: DraftSpec,
    /// Timed repeats of every run; speeds are the median over repeats (the CUDA backend runs at
    /// least 5, so that its spread means something).
    #[arg(long, allow_negative_numbers = true, default_value_t = 3, value_parser = between(1, 1000))]
    repeats: usize,
    /// Seed for random prompts and the oracle.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    seed: u64,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// CUDA only: generate a preset's synthetic weights directly in GPU memory (e.g. xs2.1).
    #[arg(long, conflicts_with = "model")]
    synthetic: Option<String>,
    /// Also time every op of the prefill and of 32 decode steps of the first prompt (CUDA: with
    /// CUDA events; CPU: the wall time of each op of the forward).
    #[arg(long)]
    profile: bool,
    /// CUDA only: write a per-block timeline of two decode steps to this CSV (kernels built with
    /// FASTDECODE_NVRTC_DEFINES=-DFD_TRACE).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// CUDA only: with --trace, the timeline of two forwards of this many rows (a DFlash verify
    /// block of that size, 1..=16) instead of two serial steps.
    #[arg(long, default_value_t = 1, requires = "trace", value_parser = clap::value_parser!(u16).range(1..=16))]
    trace_rows: u16,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn spread(v: &mut [f64]) -> serde_json::Value {
    let med = median(v);
    json!({"median": med, "min": v.first().copied().unwrap_or(0.0), "max": v.last().copied().unwrap_or(0.0)})
}

fn prompts(a: &BenchArgs, model: &LoadedModel) -> Result<Vec<Vec<u32>>> {
    match &a.prompts {
        Some(path) if path.extension().is_some_and(|e| e == "json") => {
            // Greedy traces (`assets/traces/*.json`): their prompt ids, e.g. held-out prompts.
            let text = fastdecode_model::files::read_text(path)?;
            let mut out = traces::prompt_ids(&text).with_context(|| {
                format!(
                    "{}: not a traces file with prompts[].prompt_ids",
                    path.display()
                )
            })?;
            out.truncate(a.max_prompts);
            if out.is_empty() || out.iter().any(Vec::is_empty) {
                bail!("{}: no prompts, or an empty one", path.display());
            }
            for (i, p) in out.iter().enumerate() {
                let what = format!("{}: prompts[{i}].prompt_ids", path.display());
                check_ids(p, model.target.cfg.vocab_size, &what)?;
            }
            Ok(out)
        }
        Some(path) => {
            let tok = model.tokenizer.as_ref().with_context(|| {
                format!(
                    "{}: no tokenizer.json to encode --prompts",
                    model.dir.display()
                )
            })?;
            let text = fastdecode_model::files::read_text(path)?;
            let mut out = vec![];
            for (i, line) in text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
                .take(a.max_prompts)
            {
                let ids = tok.encode(line)?;
                let what = format!("{} line {}", path.display(), i + 1);
                check_ids(&ids, model.target.cfg.vocab_size, &what)?;
                out.push(ids);
            }
            if out.is_empty() {
                bail!("{}: no prompts", path.display());
            }
            Ok(out)
        }
        None => {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(a.seed);
            let v = model.target.cfg.vocab_size as u32;
            Ok(vec![(0..a.prompt_tokens)
                .map(|_| rng.random_range(0..v))
                .collect()])
        }
    }
}

fn digest(dir: &Path) -> Option<String> {
    std::fs::read_to_string(dir.join(manifest::MANIFEST))
        .ok()
        .map(|t| manifest::digest_of(&t))
}

struct Totals {
    tokens: usize,
    decode_s: f64,
    prefill_s: f64,
    rounds: usize,
    accepted: usize,
}

impl Totals {
    fn new() -> Self {
        Totals {
            tokens: 0,
            decode_s: 0.0,
            prefill_s: 0.0,
            rounds: 0,
            accepted: 0,
        }
    }
    fn add(&mut self, g: &Generation) {
        // The first new token comes from the prefill; decode speed counts the rest.
        self.tokens += g.tokens.len() - 1;
        self.decode_s += g.decode_seconds;
        self.prefill_s += g.prefill_seconds;
        self.rounds += g.rounds;
        self.accepted += g.accepted_drafts;
    }
}

pub fn run(a: BenchArgs) -> Result<()> {
    check_trace_apart(&a)?;
    if a.backend == Backend::Cuda {
        return run_cuda(&a);
    }
    if a.synthetic.is_some() {
        bail!("--synthetic needs --backend cuda (the CPU backend reads a model directory; make one with `fastdecode synth`)");
    }
    if a.trace.is_some() {
        bail!("--trace records GPU kernels: it needs --backend cuda");
    }
    let dir = match &a.model {
        Some(d) => d.clone(),
        None => default_model_dir()?,
    };
    let model = load(&a, &dir)?;
    let ps = checked_prompts(&a, &model, &dir)?;
    let ks = block_sizes(&a, &model)?;
    let timing = Timing {
        a: &a,
        model: &model,
        prompts: &ps,
        progress: progress_bar((ps.len() * a.repeats * (1 + ks.len())) as u64),
    };
    // Serial first: its tokens are the oracle's truth and the exactness reference.
    let serial = timing.serial()?;
    let dflash_rows = ks
        .iter()
        .map(|&k| timing.dflash(k, &serial))
        .collect::<Result<Vec<_>>>()?;
    timing.progress.finish_and_clear();
    let profile = match a.profile {
        true => Some(cpu_profile(&model, &ps[0], a.decode_tokens.min(32))?),
        false => None,
    };
    report(&a, &dir, &ps, serial, &dflash_rows, profile)
}

/// Op name, ms per forward, calls per forward: the busiest first.
type Breakdown = Vec<(String, f64, f64)>;

/// The wall time of each op of the CPU forward (`fastdecode_cpu::profile`): of the prefill of
/// `prompt` (ms per prefill) and of `steps` serial decode steps after it (ms per token).
fn cpu_profile(
    model: &LoadedModel,
    prompt: &[u32],
    steps: usize,
) -> Result<(Breakdown, Breakdown)> {
    use fastdecode_cpu::profile;
    let table = |t: profile::Totals, per: usize| {
        let mut rows: Breakdown = t
            .into_iter()
            .map(|(k, (ms, n))| (k.to_string(), ms / per as f64, n as f64 / per as f64))
            .collect();
        rows.sort_by(|a, b| b.1.total_cmp(&a.1));
        rows
    };
    let target = &model.target;
    let vocab = target.cfg.vocab_size;
    let mut cache = target.new_cache(1);
    let positions: Vec<usize> = (0..prompt.len()).collect();
    profile::start();
    let out = target.forward(&mut cache, prompt, &positions, &[])?;
    let prefill = table(profile::take(), 1);
    let mut tok = fastdecode_cpu::ops::argmax(&out.logits[out.logits.len() - vocab..]) as u32;
    profile::start();
    for i in 0..steps {
        let out = target.forward(&mut cache, &[tok], &[prompt.len() + i], &[])?;
        tok = fastdecode_cpu::ops::argmax(&out.logits) as u32;
    }
    let decode = table(profile::take(), steps.max(1));
    Ok((prefill, decode))
}

/// A breakdown as the JSON report writes it (the CUDA bench's shape).
fn breakdown_json(b: &Breakdown) -> Vec<serde_json::Value> {
    b.iter()
        .map(|(op, ms, n)| json!({"op": op, "ms": ms, "launches": n}))
        .collect()
}

/// The --trace file must not be one of the inputs.
fn check_trace_apart(a: &BenchArgs) -> Result<()> {
    if let Some(t) = &a.trace {
        let mut inputs: Vec<(&str, &Path)> = vec![];
        if let Some(p) = &a.prompts {
            inputs.push(("--prompts", p));
        }
        if let Some(m) = &a.model {
            inputs.push(("model directory", m));
        }
        crate::common::outputs_apart(&[("--trace", t)], &inputs)?;
    }
    Ok(())
}

/// The CUDA backend's bench (`cuda_bench`), with at least 5 repeats.
fn run_cuda(a: &BenchArgs) -> Result<()> {
    crate::cuda_bench::run(crate::cuda_bench::CudaBenchArgs {
        model: a.model.as_deref(),
        synthetic: a.synthetic.as_deref(),
        seed: a.seed,
        prompt_tokens: a.prompt_tokens,
        decode_tokens: a.decode_tokens,
        repeats: a.repeats.max(5),
        json: a.json,
        profile: a.profile,
        trace: a.trace.clone(),
        trace_rows: a.trace_rows.into(),
        block_sizes: a.block_sizes.clone().unwrap_or_default(),
        draft: a.draft,
    })
}

/// The CPU model, with a note for each optional part left out.
fn load(a: &BenchArgs, dir: &Path) -> Result<LoadedModel> {
    // The drafter is needed only to draft with it, the tokenizer only for a text prompt file.
    let needs = Needs {
        drafter: a.draft == DraftSpec::Drafter,
        tokenizer: a
            .prompts
            .as_ref()
            .is_some_and(|p| p.extension().is_none_or(|e| e != "json")),
    };
    let model = LoadedModel::load_for(dir, needs)?;
    for note in &model.ignored {
        eprintln!("note: {note}");
    }
    Ok(model)
}

/// The prompts, each checked to fit the model with --decode-tokens after it (a random prompt's
/// length before it is drawn).
fn checked_prompts(a: &BenchArgs, model: &LoadedModel, dir: &Path) -> Result<Vec<Vec<u32>>> {
    let cfg = &model.target.cfg;
    if a.prompts.is_none() {
        check_fits(
            cfg,
            dir,
            a.prompt_tokens,
            a.decode_tokens,
            "--prompt-tokens and --decode-tokens",
        )?;
    }
    let ps = prompts(a, model)?;
    if a.prompts.is_some() {
        for (i, p) in ps.iter().enumerate() {
            let what = format!("--decode-tokens after prompt {i} of --prompts");
            check_fits(cfg, dir, p.len(), a.decode_tokens, &what)?;
        }
    }
    Ok(ps)
}

/// The DFlash block sizes to measure (default: the drafter's, 8 for the oracle), each checked
/// against the draft source's maximum.
fn block_sizes(a: &BenchArgs, model: &LoadedModel) -> Result<Vec<usize>> {
    let ks = match &a.block_sizes {
        Some(k) => k.clone(),
        None => vec![match (a.draft, &model.drafter) {
            (DraftSpec::Drafter, Some(d)) => d.cfg.block_size,
            _ => 8,
        }],
    };
    for &k in &ks {
        if k < 2 || k > max_block(model, a.draft) {
            bail!(
                "block size {k} is outside 2..={} for the {} source",
                max_block(model, a.draft),
                a.draft
            );
        }
    }
    Ok(ks)
}

fn progress_bar(runs: u64) -> ProgressBar {
    let pb = ProgressBar::new(runs);
    pb.set_style(
        ProgressStyle::with_template("bench [{bar:30}] {pos}/{len} runs {msg}")
            .expect("static")
            .progress_chars("=> "),
    );
    pb
}

/// The timed runs: every prompt, --repeats times, on the CPU model.
struct Timing<'a> {
    a: &'a BenchArgs,
    model: &'a LoadedModel,
    prompts: &'a [Vec<u32>],
    progress: ProgressBar,
}

/// Serial decoding's speeds over the repeats, and its tokens of each prompt.
struct Serial {
    tokens_per_s: Vec<f64>,
    /// Mean prefill of a prompt, ms.
    prefill_ms: Vec<f64>,
    median_tokens_per_s: f64,
    truth: Vec<Vec<u32>>,
}

impl Timing<'_> {
    /// Serial decoding, which must give the same tokens in every repeat.
    fn serial(&self) -> Result<Serial> {
        let (a, ps) = (self.a, self.prompts);
        let mut serial_tps = vec![];
        let mut serial_prefill = vec![];
        let mut truth: Vec<Vec<u32>> = vec![];
        for r in 0..a.repeats {
            let mut t = Totals::new();
            for (i, p) in ps.iter().enumerate() {
                self.progress.set_message("serial");
                let g = serial(self.model, p, a.decode_tokens, &[])?;
                if r == 0 {
                    truth.push(g.tokens.clone());
                } else if g.tokens != truth[i] {
                    bail!(
                        "serial decoding is not deterministic: prompt {i} differs between repeats"
                    );
                }
                t.add(&g);
                self.progress.inc(1);
            }
            serial_tps.push(t.tokens as f64 / t.decode_s);
            serial_prefill.push(t.prefill_s / ps.len() as f64 * 1e3);
        }
        Ok(Serial {
            median_tokens_per_s: median(&mut serial_tps.clone()),
            tokens_per_s: serial_tps,
            prefill_ms: serial_prefill,
            truth,
        })
    }

    /// DFlash at block size `k`, every run checked token for token against serial: its row of
    /// the report.
    fn dflash(&self, k: usize, serial: &Serial) -> Result<serde_json::Value> {
        let (a, truth) = (self.a, &serial.truth);
        let mut tps = vec![];
        let mut last = Totals::new();
        for _ in 0..a.repeats {
            let mut t = Totals::new();
            for (i, p) in self.prompts.iter().enumerate() {
                self.progress.set_message(format!("dflash K={k}"));
                let plan = DraftPlan {
                    block_size: k,
                    source: a.draft,
                    seed: a.seed + i as u64,
                };
                let g = dflash(self.model, p, a.decode_tokens, &[], plan, Some(&truth[i]))?;
                if g.tokens != truth[i] {
                    bail!("DFlash K={k} output differs from serial output on prompt {i}: this is a bug");
                }
                t.add(&g);
                self.progress.inc(1);
            }
            tps.push(t.tokens as f64 / t.decode_s);
            last = t;
        }
        let med = median(&mut tps.clone());
        Ok(json!({
            "block_size": k,
            "draft": a.draft.to_string(),
            "decode_tokens_per_s": spread(&mut tps),
            "rounds": last.rounds,
            "accepted_drafts": last.accepted,
            "tokens_per_round": (last.rounds + last.accepted) as f64 / last.rounds as f64,
            "acceptance_rate": last.accepted as f64 / (last.rounds * (k - 1)) as f64,
            "speedup_vs_serial": med / serial.median_tokens_per_s,
            "identical_to_serial": true,
        }))
    }
}

/// One JSON object with --json, else a table.
fn report(
    a: &BenchArgs,
    dir: &Path,
    ps: &[Vec<u32>],
    mut serial: Serial,
    dflash_rows: &[serde_json::Value],
    profile: Option<(Breakdown, Breakdown)>,
) -> Result<()> {
    let serial_med = serial.median_tokens_per_s;
    let mut out = json!({
        "fastdecode": concat!(env!("CARGO_PKG_VERSION"), " ", env!("FASTDECODE_GIT_COMMIT")),
        "unix_time": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        "backend": "cpu",
        "threads": 1,
        "model": dir.display().to_string(),
        "model_digest": digest(dir),
        "prompts": ps.len(),
        "mean_prompt_tokens": ps.iter().map(Vec::len).sum::<usize>() as f64 / ps.len() as f64,
        "decode_tokens": a.decode_tokens,
        "repeats": a.repeats,
        "serial": {
            "decode_tokens_per_s": spread(&mut serial.tokens_per_s),
            "decode_ms_per_token": 1e3 / serial_med,
            "prefill_ms": spread(&mut serial.prefill_ms),
        },
        "dflash": dflash_rows,
    });
    if let Some((prefill, decode)) = &profile {
        out["decode_breakdown_ms_per_token"] = breakdown_json(decode).into();
        out["prefill_breakdown_ms"] = breakdown_json(prefill).into();
    }
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&out)?)?;
        return Ok(());
    }
    print_table(a, dir, ps.len(), serial_med, dflash_rows)?;
    if let Some((prefill, decode)) = &profile {
        for (k, ms, n) in decode {
            outln!("  {k:<40} {ms:>8.3} ms/token  {n:>5.0} calls")?;
        }
        for (k, ms, n) in prefill {
            outln!("  {k:<40} {ms:>8.3} ms/prefill {n:>5.0} calls")?;
        }
    }
    Ok(())
}

fn print_table(
    a: &BenchArgs,
    dir: &Path,
    prompts: usize,
    serial_med: f64,
    dflash_rows: &[serde_json::Value],
) -> Result<()> {
    outln!(
        "model {} ({} prompts, {} new tokens, median of {} repeats, cpu)",
        dir.display(),
        prompts,
        a.decode_tokens,
        a.repeats
    )?;
    outln!(
        "{:<22} {:>12} {:>10} {:>12} {:>10} {:>9}",
        "run",
        "tokens/s",
        "speed-up",
        "tok/round",
        "accept",
        "rounds"
    )?;
    outln!(
        "{:<22} {:>12.1} {:>10} {:>12} {:>10} {:>9}",
        "serial",
        serial_med,
        "1.00x",
        "1.00",
        "-",
        "-"
    )?;
    for r in dflash_rows {
        outln!(
            "{:<22} {:>12.1} {:>9.2}x {:>12.2} {:>9.1}% {:>9}",
            format!("dflash K={} {}", r["block_size"], a.draft),
            r["decode_tokens_per_s"]["median"].as_f64().unwrap_or(0.0),
            r["speedup_vs_serial"].as_f64().unwrap_or(0.0),
            r["tokens_per_round"].as_f64().unwrap_or(0.0),
            100.0 * r["acceptance_rate"].as_f64().unwrap_or(0.0),
            r["rounds"],
        )?;
    }
    Ok(())
}
