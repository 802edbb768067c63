//! `fastdecode bench --backend cuda`: prefill and serial decode on the GPU, against the copy
//! bandwidth measured in the same process (the roofline of a bandwidth-bound decoder).

use std::time::Instant;

use anyhow::{bail, Context, Result};
use rand::{Rng, SeedableRng};
use serde_json::json;

use fastdecode_cuda::Gpu;
use fastdecode_engine::cuda_backend::CudaBackend;
use fastdecode_engine::session::{self, DraftPlan};
use fastdecode_engine::{DraftSpec, TargetBackend};
use fastdecode_model::config::LagunaConfig;
use fastdecode_model::inventory::{target_inventory, Layout, TensorSpec};

/// Bytes one serial decode step reads at context `ctx`: every weight a token touches once (the
/// top-k routed experts of each sparse layer, not all of them) plus the KV cache it attends over.
pub fn bytes_per_token(c: &LagunaConfig, ctx: usize, kv_bytes_per_value: usize) -> usize {
    let specs = target_inventory(c, Layout::Runtime);
    let mut total = 0usize;
    for s in &specs {
        let n = &s.name;
        if n.contains(".switch_mlp.") {
            total += s.nbytes() / c.num_experts * c.num_experts_per_tok;
        } else if n == "model.embed_tokens.weight" {
            total += s.nbytes() / c.vocab_size; // one row
        } else {
            total += s.nbytes();
        }
    }
    let kvd = c.num_key_value_heads * c.head_dim;
    for i in 0..c.num_hidden_layers {
        let keys = if c.layer_types[i] == fastdecode_model::LayerType::Sliding {
            ctx.min(c.sliding_window)
        } else {
            ctx
        };
        total += 2 * keys * kvd * kv_bytes_per_value;
    }
    total
}

fn spec_bytes(specs: &[TensorSpec]) -> usize {
    specs.iter().map(TensorSpec::nbytes).sum()
}

/// Device-to-device copy bandwidth (bytes read + written per second), median of 10 copies of 2 GiB.
fn copy_bandwidth(gpu: &Gpu) -> Result<f64> {
    let n = 1usize << 29; // 2 GiB of f32
    let src = gpu.stream.alloc_zeros::<f32>(n)?;
    let mut dst = gpu.stream.alloc_zeros::<f32>(n)?;
    gpu.stream.memcpy_dtod(&src, &mut dst)?;
    gpu.stream.synchronize()?;
    let mut times = vec![];
    for _ in 0..10 {
        let t = Instant::now();
        gpu.stream.memcpy_dtod(&src, &mut dst)?;
        gpu.stream.synchronize()?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(2.0 * (n * 4) as f64 / times[times.len() / 2])
}

pub struct CudaBenchArgs<'a> {
    pub model: Option<&'a std::path::Path>,
    pub synthetic: Option<&'a str>,
    pub seed: u64,
    pub prompt_tokens: usize,
    pub decode_tokens: usize,
    pub repeats: usize,
    pub json: bool,
    pub profile: bool,
    pub trace: Option<std::path::PathBuf>,
    /// Rows per traced forward: 1, serial steps; more, a verify block's forwards.
    pub trace_rows: usize,
    /// DFlash block sizes to time after serial decoding (none: serial only), with drafts from
    /// `draft`.
    pub block_sizes: Vec<usize>,
    pub draft: DraftSpec,
}

/// Per-op device time, from CUDA events between the ops: of the prefill of `prompt` (ms per
/// prefill) and of `steps` serial decode steps after it (ms per token).
type Breakdown = Vec<(String, f64, f64)>;

fn profile(
    target: &mut CudaBackend,
    prompt: &[u32],
    steps: usize,
) -> Result<(Breakdown, Breakdown)> {
    let (prefill, mut per_rows) = profile_rows(target, prompt, steps, &[1])?;
    Ok((prefill, per_rows.remove(0)))
}

/// Per-op device time of `steps` forwards of each row count in `rows` after the prefill of
/// `prompt` (ms per forward): a K-row forward is a verify block, rolled back after each.
fn profile_rows(
    target: &mut CudaBackend,
    prompt: &[u32],
    steps: usize,
    rows: &[usize],
) -> Result<(Breakdown, Vec<Breakdown>)> {
    let table = |prof: fastdecode_cuda::profile::Profiler, per: usize| {
        let mut rows: Breakdown = prof
            .totals
            .iter()
            .map(|(k, (ms, n))| (k.to_string(), ms / per as f64, *n as f64 / per as f64))
            .collect();
        rows.sort_by(|a, b| b.1.total_cmp(&a.1));
        rows
    };
    target.reset();
    let positions: Vec<usize> = (0..prompt.len()).collect();
    target.session().profiler = Some(Default::default());
    let tok = target.forward_greedy(prompt, &positions, &[], true)?.tokens[0];
    let prefill = table(target.session().profiler.take().expect("set above"), 1);
    let mut out = vec![];
    for &k in rows {
        target.session().profiler = Some(Default::default());
        let o = target.kv_len();
        for _ in 0..steps {
            let p: Vec<usize> = (o..o + k).collect();
            target.forward_greedy(&vec![tok; k], &p, &[], false)?;
            target.truncate(o);
        }
        out.push(table(
            target.session().profiler.take().expect("set above"),
            steps,
        ));
    }
    Ok((prefill, out))
}

/// Mean distinct routed experts per sparse layer of a `k`-row verify after `prompt`, whose rows
/// are the serial continuation `truth` (an untimed pass with the router's choices copied out).
fn distinct_experts(
    target: &mut CudaBackend,
    prompt: &[u32],
    truth: &[u32],
    k: usize,
) -> Result<f64> {
    let c = target.config().clone();
    if c.num_experts == 0 {
        return Ok(0.0);
    }
    target.reset();
    let positions: Vec<usize> = (0..prompt.len()).collect();
    target.forward_greedy(prompt, &positions, &[], true)?;
    let rows: Vec<u32> = truth.iter().copied().take(k).collect();
    let o = target.kv_len();
    let p: Vec<usize> = (o..o + rows.len()).collect();
    target.session().expert_trace = Some(vec![]);
    let r = target.forward_greedy(&rows, &p, &[], false);
    let trace = target.session().expert_trace.take().expect("set above");
    r?;
    target.truncate(o);
    if trace.is_empty() {
        return Ok(0.0);
    }
    let total: usize = trace
        .iter()
        .map(|ids| ids.iter().collect::<std::collections::BTreeSet<_>>().len())
        .sum();
    Ok(total as f64 / trace.len() as f64)
}

/// DFlash at each block size of `ks` with the oracle source on `prompt`, timed in this process
/// against serial decoding of the same prompt (`serial_tokens`, `serial_ms` per token, `step_ms`
/// per one-row step), each run checked token for token against serial.
#[allow(clippy::too_many_arguments)]
fn dflash_table(
    target: &mut CudaBackend,
    prompt: &[u32],
    serial_tokens: &[u32],
    serial_ms: f64,
    step_ms: f64,
    ks: &[usize],
    draft: DraftSpec,
    seed: u64,
    repeats: usize,
) -> Result<Vec<serde_json::Value>> {
    let vocab = target.config().vocab_size;
    let n = serial_tokens.len();
    let mut out = vec![];
    for &k in ks {
        let plan = DraftPlan {
            block_size: k,
            source: draft,
            seed,
        };
        let mut runs = vec![];
        for _ in 0..repeats {
            // `drafter` is the GPU target's resident drafter: no source is passed.
            let mut src = match draft {
                DraftSpec::Oracle(_) => Some(session::oracle_source(
                    vocab,
                    prompt,
                    plan,
                    Some(serial_tokens),
                )?),
                DraftSpec::Drafter => None,
            };
            let s = src
                .as_mut()
                .map(|s| s.as_mut() as &mut dyn fastdecode_engine::DraftSource);
            runs.push(session::run(target, s, prompt, n, k, &[])?);
        }
        let identical = runs.iter().all(|g| g.tokens == serial_tokens);
        let g = &runs[0];
        let mut ms: Vec<f64> = runs
            .iter()
            .map(|g| g.decode_seconds * 1e3 / (g.tokens.len() - 1) as f64)
            .collect();
        ms.sort_by(f64::total_cmp);
        let dm = ms[ms.len() / 2];
        let rounds = g.rounds.max(1) as f64;
        let verify_ms = runs
            .iter()
            .map(|g| g.verify_seconds * 1e3 / g.rounds.max(1) as f64)
            .fold(f64::INFINITY, f64::min);
        let draft_ms = runs
            .iter()
            .map(|g| g.draft_seconds * 1e3 / g.rounds.max(1) as f64)
            .fold(f64::INFINITY, f64::min);
        let experts = distinct_experts(target, prompt, serial_tokens, k)?;
        out.push(json!({
            "block_size": k,
            "draft": draft.to_string(),
            "decode_ms_per_token": {"median": dm, "min": ms[0], "max": ms[ms.len() - 1]},
            "tokens_per_round": (g.rounds + g.accepted_drafts) as f64 / rounds,
            "rounds": g.rounds,
            "verify_ms_per_round": verify_ms,
            "draft_ms_per_round": draft_ms,
            "verify_over_serial_step": verify_ms / step_ms,
            "distinct_routed_experts_per_sparse_layer": experts,
            "speedup_over_serial": serial_ms / dm,
            "identical_to_serial": identical,
        }));
        if !identical {
            bail!("DFlash at block size {k} ({draft}) did not reproduce serial decoding");
        }
    }
    Ok(out)
}

/// A timeline of two serial decode steps after the prompt, or with `rows` > 1 of two `rows`-row
/// forwards (a DFlash verify block's), as CSV (`fastdecode_cuda::timeline`), and its per-kernel
/// table on stderr: needs kernels built with `FASTDECODE_NVRTC_DEFINES=-DFD_TRACE`.
fn trace(
    gpu: &Gpu,
    target: &mut CudaBackend,
    prompt: &[u32],
    path: &std::path::Path,
    rows: usize,
) -> Result<()> {
    target.reset();
    let positions: Vec<usize> = (0..prompt.len()).collect();
    let mut tok = target.forward_greedy(prompt, &positions, &[], true)?.tokens[0];
    if rows > 1 {
        // The block's rows at the same positions each time (the cache cut back after each), so
        // every forward does the same work; the first captures the block size's graph.
        let block = vec![tok; rows];
        let at: Vec<usize> = (prompt.len()..prompt.len() + rows).collect();
        for i in 0..4 {
            if i == 2 {
                gpu.trace_take()?;
            }
            target.forward_greedy(&block, &at, &[], false)?;
            target.truncate(prompt.len());
        }
    } else {
        // Graphs are captured on a step's first use: only steps 2 and 3, graph replays run as
        // serial decoding runs them (each launched before the previous one's token is read),
        // are kept.
        for i in 0..2 {
            tok = target
                .forward_greedy(&[tok], &[prompt.len() + i], &[], true)?
                .tokens[0];
        }
        gpu.trace_take()?;
        target.serial_greedy(tok, 2, &[], &mut |_| {})?;
    }
    let recs = gpu.trace_take()?;
    if recs.is_empty() {
        bail!("--trace: no records; build the kernels with FASTDECODE_NVRTC_DEFINES=-DFD_TRACE");
    }
    fastdecode_cuda::timeline::write_csv(path, &recs)?;
    // The per-kernel table on stderr (stdout may be the JSON); `fastdecode timeline` redoes it.
    eprint!(
        "{}",
        fastdecode_cuda::timeline::table(&fastdecode_cuda::timeline::costs(&recs))
    );
    Ok(())
}

pub fn run(a: CudaBenchArgs) -> Result<()> {
    let t_load = Instant::now();
    let (mut target, label) = open_target(&a)?;
    let gpu = target.session().model.gpu.clone();
    gpu.stream.synchronize()?;
    let load_seconds = t_load.elapsed().as_secs_f64();
    let c = target.config().clone();
    let bandwidth = copy_bandwidth(&gpu).context("measuring copy bandwidth")?;
    let prompt = random_prompt(a.seed, a.prompt_tokens, c.vocab_size);
    let serial = time_serial(&mut target, &prompt, &a)?;
    if let Some(path) = &a.trace {
        trace(&gpu, &mut target, &prompt, path, a.trace_rows)?;
    }
    let (prefill_breakdown, breakdown) = if a.profile {
        profile(&mut target, &prompt, 32)?
    } else {
        (vec![], vec![])
    };
    let dflash = time_dflash(&mut target, &prompt, &a, &serial)?;
    let measured = Measured {
        label,
        load_seconds,
        bandwidth,
        serial,
        prefill_breakdown,
        breakdown,
        dflash,
    };
    report(&a, &gpu, &c, &measured)
}

/// The GPU target of --synthetic or --model and its label, sized for the window and the largest
/// block (of --block-sizes and a traced verify), with its drafter when it drafts.
fn open_target(a: &CudaBenchArgs) -> Result<(CudaBackend, String)> {
    let ctx = a.prompt_tokens + a.decode_tokens;
    let max_block = a
        .block_sizes
        .iter()
        .copied()
        .chain(a.trace.as_ref().map(|_| a.trace_rows))
        .max()
        .unwrap_or(1);
    let drafter = !a.block_sizes.is_empty() && a.draft == DraftSpec::Drafter;
    let (target, label) = match (a.synthetic, a.model) {
        (Some(p), _) => {
            let preset = fastdecode_model::synth::preset(p)?;
            (
                CudaBackend::synthetic(&preset, a.seed, max_block, ctx + 16, drafter)?,
                format!("synthetic {p} seed {}", a.seed),
            )
        }
        (None, Some(dir)) => (
            CudaBackend::open_dir(dir, max_block, ctx + 16, drafter)?,
            dir.display().to_string(),
        ),
        (None, None) => bail!("--backend cuda needs --model DIR or --synthetic PRESET"),
    };
    if drafter && !target.has_drafter() {
        bail!("--draft drafter: {label} has no drafter/ (use --draft oracle:P)");
    }
    Ok((target, label))
}

fn random_prompt(seed: u64, len: usize, vocab_size: usize) -> Vec<u32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..len)
        .map(|_| rng.random_range(0..vocab_size as u32))
        .collect()
}

/// Serial decoding timed over the repeats: each phase's times sorted, and the tokens, the same
/// in every repeat.
struct SerialTimes {
    prefill_ms: Vec<f64>,
    /// Per token.
    decode_ms: Vec<f64>,
    prefill_median: f64,
    decode_median: f64,
    tokens: Vec<u32>,
}

fn time_serial(target: &mut CudaBackend, prompt: &[u32], a: &CudaBenchArgs) -> Result<SerialTimes> {
    // Warm-up: compiles and loads every kernel module.
    session::run(target, None, &prompt[..a.prompt_tokens.min(16)], 4, 1, &[])?;
    let mut prefill_ms = vec![];
    let mut decode_ms = vec![];
    let mut tokens0: Option<Vec<u32>> = None;
    for _ in 0..a.repeats {
        // One run times both phases: the prefill forward (all rows' logits) and the decode steps.
        let g = session::run(target, None, prompt, a.decode_tokens, 1, &[])?;
        prefill_ms.push(g.prefill_seconds * 1e3);
        decode_ms.push(g.decode_seconds * 1e3 / (g.tokens.len() - 1) as f64);
        match &tokens0 {
            None => tokens0 = Some(g.tokens),
            Some(t0) if *t0 != g.tokens => {
                bail!("cuda decoding is not deterministic across repeats")
            }
            _ => {}
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok(SerialTimes {
        prefill_median: med(&mut prefill_ms),
        decode_median: med(&mut decode_ms),
        prefill_ms,
        decode_ms,
        // The medians above took a repeat's times: there was one.
        tokens: tokens0.expect("a repeat ran"),
    })
}

/// DFlash at each of --block-sizes (none: nothing), against a serial run of this process, and
/// each block size's verify breakdown with --profile.
fn time_dflash(
    target: &mut CudaBackend,
    prompt: &[u32],
    a: &CudaBenchArgs,
    timed: &SerialTimes,
) -> Result<DflashTimes> {
    if a.block_sizes.is_empty() {
        return Ok(DflashTimes::default());
    }
    let serial = session::run(target, None, prompt, a.decode_tokens, 1, &[])?;
    let step_ms = serial.verify_seconds * 1e3 / serial.rounds.max(1) as f64;
    // The serial tokens (the oracle's truth) must be those of the timed serial repeats.
    if serial.tokens != timed.tokens {
        bail!("cuda decoding is not deterministic across runs");
    }
    let rows = fastdecode_cuda::profile::profiled_range(|| {
        dflash_table(
            target,
            prompt,
            &serial.tokens,
            timed.decode_median,
            step_ms,
            &a.block_sizes,
            a.draft,
            a.seed,
            a.repeats.min(3),
        )
    })?;
    let mut verify_breakdowns = vec![];
    if a.profile {
        let (_, per) = profile_rows(target, prompt, 16, &a.block_sizes)?;
        verify_breakdowns = a.block_sizes.iter().copied().zip(per).collect();
    }
    Ok(DflashTimes {
        rows,
        verify_breakdowns,
    })
}

/// DFlash's rows of the report, and each block size's verify breakdown (with --profile).
#[derive(Default)]
struct DflashTimes {
    rows: Vec<serde_json::Value>,
    verify_breakdowns: Vec<(usize, Breakdown)>,
}

/// What the bench measured.
struct Measured {
    label: String,
    load_seconds: f64,
    /// Copy bandwidth, bytes per second.
    bandwidth: f64,
    serial: SerialTimes,
    prefill_breakdown: Breakdown,
    breakdown: Breakdown,
    dflash: DflashTimes,
}

/// The bandwidth-bound decoder's limit: the bytes a token reads at mid-window context, copied at
/// the measured bandwidth.
struct Roofline {
    bytes_per_token: usize,
    ms_per_token: f64,
}

/// One JSON object with --json, else text.
fn report(a: &CudaBenchArgs, gpu: &Gpu, c: &LagunaConfig, m: &Measured) -> Result<()> {
    let bytes_per_token = bytes_per_token(c, a.prompt_tokens + a.decode_tokens / 2, 4);
    let roofline = Roofline {
        bytes_per_token,
        ms_per_token: bytes_per_token as f64 / m.bandwidth * 1e3,
    };
    if a.json {
        let out = report_json(a, gpu, c, m, &roofline);
        outln!("{}", serde_json::to_string_pretty(&out)?)?;
        return Ok(());
    }
    print_report(a, gpu, m, &roofline)
}

fn report_json(
    a: &CudaBenchArgs,
    gpu: &Gpu,
    c: &LagunaConfig,
    m: &Measured,
    roofline: &Roofline,
) -> serde_json::Value {
    let (prefill_ms, decode_ms) = (&m.serial.prefill_ms, &m.serial.decode_ms);
    let (pm, dm) = (m.serial.prefill_median, m.serial.decode_median);
    let (bpt, floor_ms) = (roofline.bytes_per_token, roofline.ms_per_token);
    let (breakdown, prefill_breakdown) = (&m.breakdown, &m.prefill_breakdown);
    json!({
        "fastdecode": concat!(env!("CARGO_PKG_VERSION"), " ", env!("FASTDECODE_GIT_COMMIT")),
        "backend": "cuda",
        "gpu": gpu.name,
        "arch": gpu.arch(),
        "model": m.label,
        "weights_bytes": spec_bytes(&target_inventory(c, Layout::Runtime)),
        "load_seconds": m.load_seconds,
        "prompt_tokens": a.prompt_tokens,
        "decode_tokens": a.decode_tokens,
        "repeats": a.repeats,
        "prefill_ms": {"median": pm, "min": prefill_ms[0], "max": prefill_ms[prefill_ms.len() - 1]},
        "decode_ms_per_token": {"median": dm, "min": decode_ms[0], "max": decode_ms[decode_ms.len() - 1]},
        "bytes_per_token": bpt,
        "copy_bandwidth_bytes_per_s": m.bandwidth,
        "roofline_ms_per_token": floor_ms,
        "fraction_of_roofline": floor_ms / dm,
        "decode_breakdown_ms_per_token": breakdown.iter().map(|(k, ms, n)| json!({"op": k, "ms": ms, "launches": n})).collect::<Vec<_>>(),
        "prefill_breakdown_ms": prefill_breakdown.iter().map(|(k, ms, n)| json!({"op": k, "ms": ms, "launches": n})).collect::<Vec<_>>(),
        "dflash": m.dflash.rows,
        "verify_breakdown_ms_per_forward": m.dflash.verify_breakdowns.iter().map(|(k, b)| json!({"rows": k, "ops": b.iter().map(|(op, ms, n)| json!({"op": op, "ms": ms, "launches": n})).collect::<Vec<_>>()})).collect::<Vec<_>>(),
    })
}

fn print_report(a: &CudaBenchArgs, gpu: &Gpu, m: &Measured, roofline: &Roofline) -> Result<()> {
    let decode_ms = &m.serial.decode_ms;
    let (pm, dm) = (m.serial.prefill_median, m.serial.decode_median);
    let (bpt, floor_ms, bw) = (roofline.bytes_per_token, roofline.ms_per_token, m.bandwidth);
    let label = &m.label;
    outln!("cuda on {} ({}), {label}", gpu.name, gpu.arch())?;
    outln!(
        "prefill {} tokens: {pm:.2} ms (median of {})",
        a.prompt_tokens,
        a.repeats
    )?;
    outln!(
        "decode: {dm:.3} ms/token (median; {:.3}–{:.3}), {:.1} tokens/s",
        decode_ms[0],
        decode_ms[decode_ms.len() - 1],
        1e3 / dm
    )?;
    outln!("bytes/token {bpt}, copy bandwidth {:.2} TB/s, roofline {floor_ms:.3} ms/token, achieved {:.1} %", bw / 1e12, 100.0 * floor_ms / dm)?;
    for (k, ms, n) in &m.breakdown {
        outln!("  {k:<40} {ms:>8.3} ms/token  {n:>5.0} launches")?;
    }
    for (k, ms, n) in &m.prefill_breakdown {
        outln!("  {k:<40} {ms:>8.3} ms/prefill {n:>5.0} launches")?;
    }
    for r in &m.dflash.rows {
        outln!(
            "dflash K={:<2} {}: {:.3} ms/token, {:.2} tokens/round, verify {:.3} ms ({:.2} steps), draft {:.3} ms, {:.1} experts/layer, {:.2}x serial, identical {}",
            r["block_size"], r["draft"].as_str().unwrap_or(""), r["decode_ms_per_token"]["median"].as_f64().unwrap_or(0.0),
            r["tokens_per_round"].as_f64().unwrap_or(0.0), r["verify_ms_per_round"].as_f64().unwrap_or(0.0),
            r["verify_over_serial_step"].as_f64().unwrap_or(0.0), r["draft_ms_per_round"].as_f64().unwrap_or(0.0),
            r["distinct_routed_experts_per_sparse_layer"].as_f64().unwrap_or(0.0), r["speedup_over_serial"].as_f64().unwrap_or(0.0),
            r["identical_to_serial"]
        )?;
    }
    for (k, b) in &m.dflash.verify_breakdowns {
        outln!("verify of {k} rows:")?;
        for (op, ms, n) in b {
            outln!("  {op:<40} {ms:>8.3} ms/forward {n:>5.0} launches")?;
        }
    }
    Ok(())
}
