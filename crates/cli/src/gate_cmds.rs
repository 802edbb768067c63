//! `fastdecode golden make`, `fastdecode gate` and `fastdecode bisect`: the behaviour gate's
//! commands. Every build is a binary path, run as worker processes.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use indicatif::ProgressBar;
use rand::{Rng, SeedableRng};

use fastdecode_gate::bisect::{self, Criterion};
use fastdecode_gate::check::{self, GateParams, DEFAULT_BUDGET, DEFAULT_ENVELOPE};
use fastdecode_gate::make::make_one;
use fastdecode_gate::ScreenParams;
use fastdecode_worker::{Spec, Worker};

use crate::common::{
    at_least, bar, between, check_binary, check_ids, check_report_path, draft_source, fraction,
    load_goldens, non_negative_f32, outputs_apart, parent_of_workers, per_1000, this_binary,
    write_file, WorkerSide, MAX_BLOCK,
};

#[derive(Subcommand)]
pub enum GoldenCmd {
    /// Make golden traces with a reference build, keeping only prompts that pass the degeneracy screen.
    Make(MakeArgs),
}

#[derive(Args)]
pub struct MakeArgs {
    /// The reference build (a fastdecode binary); this binary when omitted.
    #[arg(long)]
    reference: Option<PathBuf>,
    #[command(flatten)]
    side: WorkerSide,
    /// Directory the goldens are written to (golden-000.json, ...): a new or empty directory,
    /// filled only when every golden asked for has been made.
    #[arg(long)]
    out: PathBuf,
    /// Number of goldens to make (default 4; with --prompt-ids, 1).
    #[arg(long, allow_negative_numbers = true, value_parser = at_least(1))]
    count: Option<usize>,
    /// One prompt as comma-separated token ids (default: random prompts from --seed).
    #[arg(long, allow_hyphen_values = true, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Length of random prompts.
    #[arg(long, allow_negative_numbers = true, default_value_t = 32, value_parser = at_least(1))]
    prompt_tokens: usize,
    /// Greedy tokens per golden.
    #[arg(long, allow_negative_numbers = true, default_value_t = 64, value_parser = at_least(1))]
    tokens: usize,
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    seed: u64,
    /// Random prompts tried at most, per golden wanted.
    #[arg(long, allow_negative_numbers = true, default_value_t = 8, value_parser = between(1, 1 << 20))]
    attempts_per_golden: usize,
    /// Screen: n of the n-gram repetition check.
    #[arg(long, allow_negative_numbers = true, default_value_t = ScreenParams::default().ngram, value_parser = at_least(1))]
    ngram: usize,
    /// Screen: largest fraction of n-grams that may repeat.
    #[arg(long, allow_negative_numbers = true, default_value_t = ScreenParams::default().max_ngram_hit_rate, value_parser = fraction)]
    max_ngram_hit_rate: f64,
    /// Screen: smallest fraction of distinct tokens.
    #[arg(long, allow_negative_numbers = true, default_value_t = ScreenParams::default().min_distinct_fraction, value_parser = fraction)]
    min_distinct_fraction: f64,
    /// Screen: a row is a near-tie when its top-1 and top-2 logits are this close.
    #[arg(long, allow_negative_numbers = true, default_value_t = ScreenParams::default().near_tie_gap, value_parser = non_negative_f32)]
    near_tie_gap: f32,
    /// Screen: near-tie rows required.
    #[arg(long, allow_negative_numbers = true, default_value_t = ScreenParams::default().min_near_tie_rows)]
    min_near_tie_rows: usize,
}

pub fn golden(cmd: GoldenCmd) -> Result<()> {
    let GoldenCmd::Make(a) = cmd;
    parent_of_workers();
    let count = match (a.count, &a.prompt_ids) {
        (Some(c), Some(_)) if c > 1 => {
            bail!("--count {c}: --prompt-ids gives one prompt, so it makes one golden")
        }
        (Some(c), _) => c,
        (None, Some(_)) => 1,
        (None, None) => 4,
    };
    if a.min_near_tie_rows > a.tokens {
        bail!(
            "--min-near-tie-rows {}: a golden of --tokens {} has fewer rows",
            a.min_near_tie_rows,
            a.tokens
        );
    }
    let model = a.side.model()?;
    let prompt_len = match &a.prompt_ids {
        Some(p) => {
            check_ids(p, model.vocab, "--prompt-ids")?;
            p.len()
        }
        None => a.prompt_tokens,
    };
    if prompt_len.saturating_add(a.tokens) > model.max_positions {
        bail!(
            "--tokens {} after a prompt of {prompt_len} (--prompt-tokens or --prompt-ids): more \
             than the model's max_position_embeddings {} ({})",
            a.tokens,
            model.max_positions,
            model.source
        );
    }
    // An n-gram longer than the continuation never occurs in it: the repetition screen would
    // pass every golden while seeming to check it.
    if a.ngram > a.tokens {
        bail!(
            "--ngram {} is longer than --tokens {}: no n-gram of the continuation could repeat",
            a.ngram,
            a.tokens
        );
    }
    // The goldens are written into a staging directory beside --out, renamed into place only
    // when all of them are made: --out never holds a mix of new and old goldens.
    if let Some(dir) = model.dir() {
        fastdecode_model::files::refuse_overlap(&a.out, dir, "model directory").context("--out")?;
    }
    if let Some(r) = &a.reference {
        outputs_apart(&[("--out", &a.out)], &[("--reference build", r)])?;
    }
    let staged = fastdecode_model::files::StagedDir::new(&a.out, true).context("--out")?;
    let bin = match &a.reference {
        Some(b) => check_binary(b, "--reference")?,
        None => this_binary()?,
    };
    let params = ScreenParams {
        ngram: a.ngram,
        max_ngram_hit_rate: a.max_ngram_hit_rate,
        min_distinct_fraction: a.min_distinct_fraction,
        near_tie_gap: a.near_tie_gap,
        min_near_tie_rows: a.min_near_tie_rows,
    };
    // Random prompts are drawn one at a time as they are tried.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(a.seed);
    let mut next_prompt = |i: usize| -> Option<Vec<u32>> {
        match &a.prompt_ids {
            Some(p) => (i == 0).then(|| p.clone()),
            None => (i < count.saturating_mul(a.attempts_per_golden)).then(|| {
                (0..a.prompt_tokens)
                    .map(|_| rng.random_range(0..model.vocab as u32))
                    .collect()
            }),
        }
    };
    // Greedy windows and replays: no drafter to load.
    let spec = Spec {
        drafter: false,
        ..a.side.spec(&bin, &model, Some(String::new()))
    };
    let mut w = Worker::spawn(&spec, model.vocab, &model.digest)?;
    let pb = bar(count as u64, "golden");
    let (mut made, mut rejected) = (0, 0);
    let mut tried = 0;
    while made < count {
        let Some(p) = next_prompt(tried) else { break };
        tried += 1;
        match make_one(&mut w, &model, &p, a.tokens, &params)? {
            Ok(g) => {
                let name = format!("golden-{made:03}.json");
                g.save(&staged.path().join(&name))?;
                pb.suspend(|| {
                    eprintln!(
                        "{}: {} prompt + {} tokens, {:.0} % distinct, {} near-tie rows",
                        a.out.join(&name).display(),
                        g.prompt.len(),
                        g.tokens.len(),
                        100.0 * g.screen.distinct_fraction,
                        g.screen.near_tie_rows
                    )
                });
                made += 1;
                pb.inc(1);
            }
            Err(why) => {
                rejected += 1;
                pb.suspend(|| eprintln!("prompt rejected: {why}"));
            }
        }
    }
    pb.finish_and_clear();
    w.shutdown();
    if made < count {
        bail!(
            "only {made} of {count} goldens passed the degeneracy screen ({rejected} prompt(s) \
             rejected); nothing was written to {}",
            a.out.display()
        );
    }
    staged.commit()?;
    outln!(
        "made {made} golden(s) in {}, {rejected} prompt(s) rejected by the screen",
        a.out.display()
    )?;
    Ok(())
}

#[derive(Args)]
pub struct GateArgs {
    /// The pinned reference build.
    #[arg(long)]
    reference: PathBuf,
    /// The build under test.
    #[arg(long)]
    candidate: PathBuf,
    /// Golden traces: files, or directories of *.json.
    #[arg(long, num_args = 1.., required = true)]
    golden: Vec<PathBuf>,
    #[command(flatten)]
    side: WorkerSide,
    /// Optimisation flags switched on in the candidate's workers.
    #[arg(long)]
    candidate_flags: Option<String>,
    /// Near-tie envelope: reference top-1 logit minus the emitted token's logit.
    #[arg(long, allow_negative_numbers = true, default_value_t = DEFAULT_ENVELOPE, value_parser = non_negative_f32)]
    envelope: f32,
    /// Near-ties allowed per 1000 checked tokens (0 to 1000).
    #[arg(long, allow_negative_numbers = true, default_value_t = DEFAULT_BUDGET, value_parser = per_1000)]
    budget: f64,
    /// DFlash block size of the exactness check (1 skips it; at most 16).
    #[arg(long, allow_negative_numbers = true, default_value_t = 4, value_parser = between(1, MAX_BLOCK))]
    block_size: usize,
    /// Oracle acceptance probability of the DFlash check (the rest are forced rejections).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.7, value_parser = fraction)]
    oracle_p: f64,
    /// The draft source the track prices (`drafter` or `oracle:P`): its DFlash output must
    /// equal serial too, at `--draft-block-size`.
    #[arg(long, value_parser = draft_source)]
    draft: Option<String>,
    /// Block size of the `--draft` check (2 to 16; default: --block-size).
    #[arg(long, requires = "draft", allow_negative_numbers = true, value_parser = between(2, MAX_BLOCK))]
    draft_block_size: Option<usize>,
    /// Also write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub fn gate(a: GateArgs) -> Result<()> {
    parent_of_workers();
    let model = a.side.model()?;
    if let Some(p) = &a.json {
        let mut inputs = vec![
            ("--reference build", a.reference.as_path()),
            ("--candidate build", a.candidate.as_path()),
        ];
        inputs.extend(a.golden.iter().map(|g| ("--golden", g.as_path())));
        outputs_apart(&[("--json", p)], &inputs)?;
        check_report_path(p, &model, "--json")?;
    }
    let goldens = load_goldens(&a.golden)?;
    let reference_bin = check_binary(&a.reference, "--reference")?;
    let candidate_bin = check_binary(&a.candidate, "--candidate")?;
    let params = GateParams {
        envelope: a.envelope,
        budget_per_1000: a.budget,
        block_size: a.block_size,
        oracle_p: a.oracle_p,
        own_draft: a
            .draft
            .clone()
            .map(|d| (a.draft_block_size.unwrap_or(a.block_size), d)),
    };
    // Workers get an explicit (possibly empty) flag list, so the parent's FASTDECODE_FLAGS never leaks in.
    let reference = a.side.spec(&reference_bin, &model, Some(String::new()));
    let candidate = a.side.spec(
        &candidate_bin,
        &model,
        Some(a.candidate_flags.clone().unwrap_or_default()),
    );
    let pb = bar(goldens.len() as u64, "gate");
    let rep = check::run(&reference, &candidate, &model, &goldens, &params, &pb)?;
    pb.finish_and_clear();
    if let Some(p) = &a.json {
        write_file(p, &(serde_json::to_string_pretty(&rep)? + "\n"))?;
    }
    outln!(
        "{:<12} {:>8} {:>9} {:>6}",
        "check",
        "exact",
        "near-tie",
        "fail"
    )?;
    for (name, c) in [("replay", rep.replay), ("fidelity", rep.fidelity)] {
        outln!("{name:<12} {:>8} {:>9} {:>6}", c.exact, c.near_tie, c.fail)?;
    }
    outln!(
        "near-ties {} of {} allowed ({} per 1000 over {} tokens, envelope {})",
        rep.near_ties,
        rep.near_ties_allowed,
        rep.budget_per_1000,
        rep.checked_tokens,
        rep.envelope
    )?;
    match &rep.failure {
        None => {
            outln!("gate: passed ({} goldens)", rep.goldens.len())?;
            Ok(())
        }
        Some(f) => {
            let mut at = String::new();
            if let Some(g) = &f.golden {
                at += &format!(" in {g}");
            }
            if let Some(s) = f.step {
                at += &format!(" at step {s}");
            }
            if let Some(side) = &f.side {
                at += &format!(" ({side})");
            }
            if let Some(d) = &f.detail {
                at += &format!(": {d}");
            }
            bail!("gate: failed: {}{at}", f.category)
        }
    }
}

#[derive(Args)]
pub struct BisectArgs {
    /// Golden traces made with this build's flags off: files, or directories of *.json.
    #[arg(long, num_args = 1.., required = true)]
    golden: Vec<PathBuf>,
    /// The build to bisect; this binary when omitted.
    #[arg(long)]
    candidate: Option<PathBuf>,
    #[command(flatten)]
    side: WorkerSide,
    /// Flags to search, comma-separated (default: every flag the build knows).
    #[arg(long, value_delimiter = ',')]
    flags: Option<Vec<String>>,
    /// What counts as diverging: `tokens` (an argmax differs) or `logits` (a top-1 logit differs in any bit).
    #[arg(long, default_value = "tokens", value_parser = ["tokens", "logits"])]
    criterion: String,
    /// Also write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub fn bisect(a: BisectArgs) -> Result<()> {
    parent_of_workers();
    let model = a.side.model()?;
    if let Some(p) = &a.json {
        let mut inputs: Vec<(&str, &std::path::Path)> =
            a.golden.iter().map(|g| ("--golden", g.as_path())).collect();
        if let Some(c) = &a.candidate {
            inputs.push(("--candidate build", c));
        }
        outputs_apart(&[("--json", p)], &inputs)?;
        check_report_path(p, &model, "--json")?;
    }
    // `--flags ,` splits into empty names, which a worker reads as no flag at all: the search
    // would end "no culprit" having searched nothing.
    if let Some(f) = a
        .flags
        .as_ref()
        .filter(|f| f.iter().any(|x| x.trim().is_empty()))
    {
        bail!(
            "--flags {:?}: an empty flag name (name flags separated by commas)",
            f.join(",")
        );
    }
    let goldens = load_goldens(&a.golden)?;
    let bin = match &a.candidate {
        Some(b) => check_binary(b, "--candidate")?,
        None => this_binary()?,
    };
    let c = if a.criterion == "logits" {
        Criterion::Logits
    } else {
        Criterion::Tokens
    };
    let pb = ProgressBar::new_spinner();
    let rep = bisect::run(
        &a.side.spec(&bin, &model, None),
        &model,
        &goldens,
        a.flags.clone(),
        c,
        &pb,
    )?;
    pb.finish_and_clear();
    if let Some(p) = &a.json {
        write_file(p, &(serde_json::to_string_pretty(&rep)? + "\n"))?;
    }
    outln!(
        "{:<28} {:>7} {:>10} {:>14} {:>9}",
        "flags",
        "steps",
        "mismatch",
        "max |dlogit|",
        "diverges"
    )?;
    for t in &rep.trials {
        let f = if t.flags.is_empty() {
            "(none)".to_string()
        } else {
            t.flags.join(",")
        };
        outln!(
            "{f:<28} {:>7} {:>10} {:>14.3e} {:>9}",
            t.steps,
            t.token_mismatches,
            t.max_abs_logit_delta,
            t.diverges
        )?;
    }
    if rep.culprit.is_empty() {
        outln!(
            "no divergence with every searched flag on ({})",
            rep.searched.join(",")
        )?;
    } else {
        outln!("culprit: {}", rep.culprit.join(","))?;
    }
    Ok(())
}
