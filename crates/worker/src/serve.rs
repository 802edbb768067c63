//! The worker's side: load, verify and warm a model, say `ready`, then serve requests until
//! `shutdown` or end of input. Nothing here reads a clock: the parent times the windows.

use std::io::{BufRead, Write};
use std::str::FromStr;

use anyhow::{bail, Context, Result};

use fastdecode_cpu::flags::{self, Flags};
use fastdecode_cpu::ops::top2;
use fastdecode_engine::cuda_backend::CudaBackend;
use fastdecode_engine::session::{draft_source, drafts_source, max_block};
use fastdecode_engine::{
    generate_observed, CpuTarget, DecodeOptions, DraftPlan, DraftSource, DraftSpec, LoadedModel,
    TargetBackend,
};
use fastdecode_model::config::MAX_BLOCK_SIZE;
use fastdecode_model::{manifest, LagunaConfig};

use crate::protocol::{
    Build, ModelSource, Ready, ReplayRequest, Reply, Request, Scored, Step, WindowRequest,
    DRAFTER_VAR, PROTOCOL, VERSION,
};

/// Which compute backend serves the requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The f32 reference engine.
    Cpu,
    /// The CUDA engine: the target on the GPU, uploaded from a runtime checkpoint or generated
    /// there (`--synthetic`); drafts from the oracle.
    Cuda,
}

impl FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "cpu" => Ok(Backend::Cpu),
            "cuda" => Ok(Backend::Cuda),
            other => Err(format!("unknown backend {other:?} (known: cpu, cuda)")),
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backend::Cpu => write!(f, "cpu"),
            Backend::Cuda => write!(f, "cuda"),
        }
    }
}

pub struct WorkerOptions {
    pub model: ModelSource,
    pub backend: Backend,
    pub flags: Flags,
    /// CUDA: the longest context (prompt + decode tokens + one block) a window may reach; the
    /// KV cache is sized for it once, at start-up.
    pub max_context: usize,
}

fn write_line(out: &mut impl Write, reply: &Reply) -> std::io::Result<()> {
    let line = serde_json::to_string(reply).map_err(std::io::Error::other)?;
    out.write_all(line.as_bytes())?;
    out.write_all(b"\n")?;
    out.flush()
}

/// The loaded engine: the CPU reference (a fresh target per request) or one GPU session kept
/// for the worker's life (its KV cache and captured step graphs are reused by every request).
enum Engine {
    Cpu {
        model: Box<LoadedModel>,
        target: Option<CpuTarget>,
    },
    Cuda {
        target: Box<CudaBackend>,
        max_context: usize,
    },
}

/// A DFlash request's draft plan with the prompt and (for the oracle) the drafts its parent
/// realised.
struct DraftRequest<'a> {
    plan: DraftPlan,
    prompt: &'a [u32],
    drafts: Option<&'a [u32]>,
}

impl DraftRequest<'_> {
    /// The oracle's source from the parent's drafts (the worker is never given the truth).
    fn oracle(&self) -> Result<Box<dyn DraftSource>> {
        let drafts = self
            .drafts
            .context("an oracle:P window needs the drafts its parent realised (`drafts`)")?;
        Ok(drafts_source(self.prompt, self.plan, drafts)?)
    }
}

/// A request's target and draft source (none when serial).
type Decoding<'a> = (&'a mut dyn TargetBackend, Option<Box<dyn DraftSource>>);

/// Whether a CUDA worker loads the GPU drafter (`DRAFTER_VAR`).
fn gpu_drafter_wanted() -> Result<bool> {
    drafter_knob(std::env::var(DRAFTER_VAR).ok().as_deref())
}

/// The drafter knob's value: unset, empty or `1` loads it, `0` does not, and anything else is
/// refused by name (a mistyped `off` would otherwise load it silently, as the CUDA backend's
/// knobs did before they were checked).
fn drafter_knob(value: Option<&str>) -> Result<bool> {
    match value {
        None | Some("") | Some("1") => Ok(true),
        Some("0") => Ok(false),
        Some(v) => bail!("FASTDECODE_WORKER_DRAFTER=\"{v}\": not a value it takes (one of 0, 1)"),
    }
}

/// Verifies and loads the model; returns the engine and the digest the worker reports.
fn load(opts: &WorkerOptions) -> Result<(Engine, String)> {
    match (&opts.model, opts.backend) {
        (ModelSource::Dir(dir), backend) => {
            let verified = manifest::verify(dir, &indicatif::ProgressBar::hidden())
                .with_context(|| format!("{}: model verification", dir.display()))?;
            let engine = match backend {
                Backend::Cpu => Engine::Cpu {
                    model: Box::new(LoadedModel::load(dir)?),
                    target: None,
                },
                Backend::Cuda => {
                    let cfg = LagunaConfig::from_file(&dir.join("config.json"))?;
                    let max_context = check_context(&cfg, opts.max_context)?;
                    let target = CudaBackend::open_dir(
                        dir,
                        MAX_BLOCK_SIZE,
                        max_context,
                        gpu_drafter_wanted()?,
                    )
                    .with_context(|| format!("{}: uploading to the GPU", dir.display()))?;
                    Engine::Cuda {
                        target: Box::new(target),
                        max_context,
                    }
                }
            };
            Ok((engine, verified.digest))
        }
        (ModelSource::Synthetic { preset, seed }, Backend::Cuda) => {
            let p = fastdecode_model::synth::preset(preset)?;
            let max_context = check_context(&p.target, opts.max_context)?;
            let target = CudaBackend::synthetic(
                &p,
                *seed,
                MAX_BLOCK_SIZE,
                max_context,
                gpu_drafter_wanted()?,
            )?;
            let digest = fastdecode_model::synth::synthetic_digest(preset, *seed)?;
            let engine = Engine::Cuda {
                target: Box::new(target),
                max_context,
            };
            Ok((engine, digest))
        }
        (ModelSource::Synthetic { .. }, Backend::Cpu) => {
            bail!("--synthetic generates weights in GPU memory: it needs --backend cuda")
        }
    }
}

/// `max_context`, checked against the model's limit.
fn check_context(cfg: &LagunaConfig, max_context: usize) -> Result<usize> {
    let limit = cfg.max_position_embeddings;
    if max_context == 0 || max_context > limit {
        bail!("--max-context {max_context} is outside 1..={limit} (the model's max_position_embeddings)");
    }
    Ok(max_context)
}

/// Runs a worker: everything before the `ready` line (load, MANIFEST verification, warm-up) is
/// never timed by a parent.
pub fn run(
    opts: &WorkerOptions,
    build: Build,
    mut input: impl BufRead,
    mut output: impl Write,
) -> Result<()> {
    flags::set_active(opts.flags);
    let mut start = StartTimes::new();
    let (engine, digest) = load(opts)?;
    start.lap("load");
    let mut server = Server { engine };
    server.warm(&mut start)?;
    // Where a start-up's seconds went, for whoever reads the worker's log (a parent prices none
    // of it, and trusts none of it: it times the start-up itself).
    eprintln!("worker: ready after {start}");
    let ready = Ready {
        protocol: PROTOCOL.into(),
        version: VERSION,
        build,
        backend: opts.backend.to_string(),
        flags: opts.flags.names().iter().map(|s| s.to_string()).collect(),
        known_flags: flags::ALL.iter().map(|f| f.name.to_string()).collect(),
        model_digest: digest,
        vocab_size: server.config().vocab_size,
        max_block: server.max_block(),
    };
    write_line(&mut output, &Reply::Ready(ready))?;
    // The longest request a parent can need: three token lists (prompt, chain or drafts) of the
    // model's longest sequence. A longer line is refused without being held.
    let max_line = server
        .config()
        .max_position_embeddings
        .saturating_mul(3 * 12)
        + (64 << 10);
    loop {
        let line =
            match crate::lines::read_line(&mut input, || max_line).context("reading a request")? {
                crate::lines::Bounded::Eof => break,
                crate::lines::Bounded::Line(l) => String::from_utf8(l),
                crate::lines::Bounded::TooLong => {
                    crate::lines::skip_line(&mut input).context("reading a request")?;
                    let message = format!("bad request: a line longer than {max_line} bytes");
                    write_line(&mut output, &Reply::Error { id: None, message })?;
                    continue;
                }
            };
        let req: Request = match line.as_deref().map(|l| (l.trim().is_empty(), l)) {
            Ok((true, _)) => continue,
            Ok((false, l)) => match Request::parse(l) {
                Ok(r) => r,
                Err(e) => {
                    let message = format!("bad request: {e}");
                    write_line(&mut output, &Reply::Error { id: None, message })?;
                    continue;
                }
            },
            Err(e) => {
                let message = format!("bad request: not UTF-8 ({e})");
                write_line(&mut output, &Reply::Error { id: None, message })?;
                continue;
            }
        };
        let (id, result) = match req {
            Request::Shutdown => return Ok(()),
            Request::Window(w) => (w.id, server.window(&w, &mut output)),
            Request::Replay(r) => (
                r.id,
                server
                    .replay(&r)
                    .map(|steps| Reply::Replay { id: r.id, steps }),
            ),
        };
        let reply = result.unwrap_or_else(|e| Reply::Error {
            id: Some(id),
            message: format!("{e:#}"),
        });
        write_line(&mut output, &reply)?;
    }
    Ok(())
}

/// Replays `r.chain` teacher-forced on `target`, `block` rows a forward at most after the
/// prompt's prefill. Every step's distribution is computed the way decoding computed the token it
/// scores, so an exact build's replay agrees with its own greedy decoding bit for bit: step 0 is
/// the prompt's prefill (its last row, `prefill_logits`), step i the row of chain[i - 1] through
/// the step path a decoding step takes (batch-invariant: any rows per launch give the same bits),
/// never a long run of rows, which a GPU computes with other summation orders.
fn replay_on(target: &mut dyn TargetBackend, block: usize, r: &ReplayRequest) -> Result<Vec<Step>> {
    target.reset();
    let n = r.chain.len();
    if n == 0 {
        return Ok(vec![]);
    }
    let vocab = target.config().vocab_size;
    let positions: Vec<usize> = (0..r.prompt.len()).collect();
    let first = target.prefill_logits(&r.prompt, &positions)?;
    let mut steps = Vec::with_capacity(n);
    steps.push(replay_step(&first, &r.chain, 0, r.probe)?);
    let mut at = r.prompt.len();
    for rows in r.chain[..n - 1].chunks(block) {
        let positions: Vec<usize> = (at..at + rows.len()).collect();
        let out = target.forward(rows, &positions, &[])?;
        for logits in out.logits.chunks_exact(vocab) {
            steps.push(replay_step(logits, &r.chain, steps.len(), r.probe)?);
        }
        at += rows.len();
    }
    Ok(steps)
}

/// A replay's step `i` from its row's logits: the top two, and the chain token's own logit when
/// the request probes.
fn replay_step(logits: &[f32], chain: &[u32], i: usize, probe: bool) -> Result<Step> {
    let [(a, la), (b, lb)] = top2(logits);
    let probe_logit = if probe {
        let t = chain[i] as usize;
        Some(*logits.get(t).with_context(|| {
            format!("replay: chain token {t} at step {i} is outside the vocabulary")
        })?)
    } else {
        None
    };
    Ok(Step {
        top: [
            Scored {
                id: a as u32,
                logit: la,
            },
            Scored {
                id: b as u32,
                logit: lb,
            },
        ],
        probe_logit,
    })
}

struct Server {
    engine: Engine,
}

/// The seconds of each part of a worker's start-up, in order.
struct StartTimes {
    last: std::time::Instant,
    parts: Vec<(&'static str, f64)>,
}

impl StartTimes {
    fn new() -> Self {
        StartTimes {
            last: std::time::Instant::now(),
            parts: vec![],
        }
    }

    /// Ends the part called `name`, which began where the last one ended.
    fn lap(&mut self, name: &'static str) {
        let now = std::time::Instant::now();
        self.parts
            .push((name, now.duration_since(self.last).as_secs_f64()));
        self.last = now;
    }
}

impl std::fmt::Display for StartTimes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let total: f64 = self.parts.iter().map(|(_, s)| s).sum();
        let parts: Vec<String> = self
            .parts
            .iter()
            .map(|(name, s)| format!("{name} {s:.2} s"))
            .collect();
        write!(f, "{total:.2} s ({})", parts.join(", "))
    }
}

impl Server {
    fn config(&self) -> &LagunaConfig {
        match &self.engine {
            Engine::Cpu { model, .. } => &model.target.cfg,
            Engine::Cuda { target, .. } => target.config(),
        }
    }

    fn max_block(&self) -> usize {
        match &self.engine {
            Engine::Cpu { model, .. } => max_block(model, DraftSpec::Oracle(0.0)),
            Engine::Cuda { .. } => MAX_BLOCK_SIZE,
        }
    }

    /// The target for a request of blocks up to `block_size` rows, and the draft source `plan`
    /// names (none for serial requests).
    fn target_and_source(
        &mut self,
        draft: Option<DraftRequest>,
        block_size: usize,
    ) -> Result<Decoding<'_>> {
        match &mut self.engine {
            Engine::Cpu { model, target } => {
                let source = match draft {
                    Some(d) if matches!(d.plan.source, DraftSpec::Oracle(_)) => Some(d.oracle()?),
                    Some(d) => Some(draft_source(model, d.prompt, d.plan, None)?),
                    None => None,
                };
                let t = target.insert(CpuTarget::new(model.target.clone(), block_size));
                Ok((t, source))
            }
            Engine::Cuda { target, .. } => {
                let source = match draft {
                    Some(d) => match d.plan.source {
                        DraftSpec::Oracle(_) => Some(d.oracle()?),
                        // The GPU drafter is the target's resident source: none is passed.
                        DraftSpec::Drafter => match target.drafter_block_size() {
                            Some(max) if d.plan.block_size <= max => None,
                            Some(max) => bail!(
                                "block size {} is above the drafter's maximum {max}",
                                d.plan.block_size
                            ),
                            None => bail!("this model has no drafter/ (use --draft oracle:P)"),
                        },
                    },
                    None => None,
                };
                Ok((target.as_mut(), source))
            }
        }
    }

    /// Runs each kind of request once on a short prompt so first-touch costs (page faults,
    /// allocator growth, kernel compilation, the GPU's step graphs) fall before `ready`.
    fn warm(&mut self, start: &mut StartTimes) -> Result<()> {
        let vocab = self.config().vocab_size as u32;
        let prompt: Vec<u32> = (0..16u32).map(|i| (i * 7 + 1) % vocab).collect();
        let mut sink = std::io::sink();
        let mut w = WindowRequest {
            id: 0,
            prompt: prompt.clone(),
            decode_tokens: 8,
            block_size: 1,
            draft: None,
            drafts: None,
        };
        let Reply::Window { tokens, .. } = self.window(&w, &mut sink)? else {
            bail!("warm-up: a window did not end in a window reply");
        };
        start.lap("serial window");
        w.block_size = 4;
        w.draft = Some("oracle:0.5".into());
        w.drafts = Some(fastdecode_engine::oracle::realise(
            &tokens,
            0.5,
            vocab as usize,
            0,
        )?);
        self.window(&w, &mut sink)?;
        start.lap("oracle window");
        self.replay(&ReplayRequest {
            id: 0,
            prompt: prompt.clone(),
            chain: tokens,
            probe: true,
        })?;
        start.lap("replay");
        let drafter_block = match &self.engine {
            Engine::Cuda { target, .. } => target.drafter_block_size(),
            Engine::Cpu { .. } => None,
        };
        if let Some(max) = drafter_block {
            // The GPU drafter's block forwards and the tapped verify steps: a graph per block
            // size, captured here rather than in a timed window.
            for k in 2..=max.min(MAX_BLOCK_SIZE) {
                w.block_size = k;
                w.draft = Some("drafter".into());
                // The oracle window's drafts are not the drafter's to take.
                w.drafts = None;
                w.decode_tokens = 2 * k;
                self.window(&w, &mut sink)?;
            }
            start.lap("drafter windows");
        }
        if let Engine::Cuda { target, .. } = &mut self.engine {
            // Every step shape a window can use: one graph per row count (a verify block, or the
            // last short round of a window), and a prefill chunk past the step limit.
            let long: Vec<u32> = (0..2 * MAX_BLOCK_SIZE as u32)
                .map(|i| (i * 13 + 5) % vocab)
                .collect();
            let positions: Vec<usize> = (0..long.len()).collect();
            target.reset();
            target.forward_greedy(&long, &positions, &[], true)?;
            let o = target.kv_len();
            for n in 1..=MAX_BLOCK_SIZE {
                let p: Vec<usize> = (o..o + n).collect();
                target.forward_greedy(&long[..n], &p, &[], false)?;
                target.truncate(o);
            }
            start.lap("step shapes");
        }
        Ok(())
    }

    /// Serves a window; writes the `seeded` line itself, mid-window, and returns the final reply.
    fn window(&mut self, w: &WindowRequest, out: &mut impl Write) -> Result<Reply> {
        if w.block_size == 0 {
            bail!("block_size must be at least 1");
        }
        if let Engine::Cuda { max_context, .. } = &self.engine {
            let need = w.prompt.len() as u128 + w.decode_tokens as u128 + w.block_size as u128;
            if need > *max_context as u128 {
                bail!(
                    "a window of {} prompt + {} decode tokens (block {}) exceeds this worker's --max-context {max_context}",
                    w.prompt.len(),
                    w.decode_tokens,
                    w.block_size
                );
            }
        }
        let oracle = w.draft.as_deref().is_some_and(|d| d.starts_with("oracle:"));
        if w.drafts.is_some() && !(oracle && w.block_size > 1) {
            bail!("drafts are for DFlash windows (block_size > 1) drafted by oracle:P only");
        }
        let plan = if w.block_size > 1 {
            let spec: DraftSpec = w
                .draft
                .as_deref()
                .context("a window with block_size > 1 needs a draft source")?
                .parse()
                .map_err(anyhow::Error::msg)?;
            let plan = DraftPlan {
                block_size: w.block_size,
                source: spec,
                seed: 0,
            };
            Some(DraftRequest {
                plan,
                prompt: &w.prompt,
                drafts: w.drafts.as_deref(),
            })
        } else {
            None
        };
        let (target, mut source) = self.target_and_source(plan, w.block_size)?;
        let opts = DecodeOptions {
            max_new_tokens: w
                .decode_tokens
                .checked_add(1)
                .context("decode_tokens is too large")?,
            block_size: w.block_size,
            stop_tokens: &[],
        };
        let mut seeded_err = None;
        let g = generate_observed(
            target,
            match &mut source {
                Some(s) => Some(s.as_mut()),
                None => None,
            },
            &w.prompt,
            &opts,
            &mut |token, kv_len| {
                let r = write_line(
                    out,
                    &Reply::Seeded {
                        id: w.id,
                        token,
                        kv_len,
                    },
                );
                seeded_err = r.err();
            },
            &mut |_| {},
        )?;
        if let Some(e) = seeded_err {
            return Err(e).context("writing the seeded line");
        }
        Ok(Reply::Window {
            id: w.id,
            tokens: g.tokens,
            kv_len: target.kv_len(),
        })
    }

    fn replay(&mut self, r: &ReplayRequest) -> Result<Vec<Step>> {
        if r.prompt.is_empty() {
            bail!("replay: the prompt must have at least one token");
        }
        if let Engine::Cuda { max_context, .. } = &self.engine {
            if r.prompt.len() + r.chain.len() > *max_context {
                bail!(
                    "a replay of {} prompt + {} chain tokens exceeds this worker's --max-context {max_context}",
                    r.prompt.len(),
                    r.chain.len()
                );
            }
        }
        // The chain's rows run as a DFlash verify block does: at most this many a forward.
        let block = self.max_block().max(1);
        let (target, _) = self.target_and_source(None, 1)?;
        replay_on(target, block, r)
    }
}

#[cfg(test)]
mod tests {
    use super::{drafter_knob, replay_on};
    use crate::protocol::ReplayRequest;
    use fastdecode_engine::backend::{ForwardOut, Greedy};
    use fastdecode_engine::{generate, CpuTarget, DecodeOptions, LoadedModel, TargetBackend};
    use fastdecode_model::inventory::Layout;
    use fastdecode_model::synth::{preset, write_synthetic};
    use fastdecode_model::{LagunaConfig, Result};

    /// A target with a GPU's two paths: runs of more than `step_rows` rows through `forward`
    /// (the prefill's GEMMs) land elsewhere than decoding's rows (caricatured here: each row's
    /// top two logits swap, where a GPU differs in the last bits and flips only near-ties);
    /// decoding's choices and `prefill_logits` take the step path, the CPU's exact rows.
    struct TwoPaths {
        inner: CpuTarget,
        step_rows: usize,
    }

    impl TargetBackend for TwoPaths {
        fn config(&self) -> &LagunaConfig {
            self.inner.config()
        }
        fn forward(&mut self, t: &[u32], p: &[usize], taps: &[usize]) -> Result<ForwardOut> {
            let mut out = self.inner.forward(t, p, taps)?;
            if t.len() > self.step_rows {
                let vocab = self.config().vocab_size;
                for row in out.logits.chunks_exact_mut(vocab) {
                    let [(a, _), (b, _)] = fastdecode_cpu::ops::top2(row);
                    row.swap(a, b);
                }
            }
            Ok(out)
        }
        fn forward_greedy(
            &mut self,
            t: &[u32],
            p: &[usize],
            taps: &[usize],
            last_only: bool,
        ) -> Result<Greedy> {
            self.inner.forward_greedy(t, p, taps, last_only)
        }
        fn prefill_logits(&mut self, t: &[u32], p: &[usize]) -> Result<Vec<f32>> {
            self.inner.prefill_logits(t, p)
        }
        fn kv_len(&self) -> usize {
            self.inner.kv_len()
        }
        fn truncate(&mut self, len: usize) {
            self.inner.truncate(len)
        }
        fn reset(&mut self) {
            self.inner.reset()
        }
    }

    #[test]
    fn a_replay_agrees_with_greedy_decoding_on_a_target_whose_long_runs_differ() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("tiny");
        let hidden = indicatif::ProgressBar::hidden();
        write_synthetic(&dir, &preset("tiny").unwrap(), 1, Layout::Runtime, &hidden).unwrap();
        let model = LoadedModel::load(&dir).unwrap();
        let (step_rows, block) = (6, 4);
        let mut target = TwoPaths {
            inner: CpuTarget::new(model.target.clone(), step_rows),
            step_rows,
        };
        let vocab = target.config().vocab_size as u32;
        let prompt: Vec<u32> = (0..20u32).map(|i| (i * 37 + 11) % vocab).collect();
        let opts = DecodeOptions {
            max_new_tokens: 23,
            block_size: 1,
            stop_tokens: &[],
        };
        let chain = generate(&mut target, None, &prompt, &opts, &mut |_| {})
            .unwrap()
            .tokens;
        let r = ReplayRequest {
            id: 1,
            prompt: prompt.clone(),
            chain: chain.clone(),
            probe: true,
        };
        let steps = replay_on(&mut target, block, &r).unwrap();
        let ids: Vec<u32> = steps.iter().map(|s| s.top[0].id).collect();
        assert_eq!(ids, chain, "the replay's top choices are decoding's tokens");
        assert!(steps.iter().all(|s| s.probe_logit == Some(s.top[0].logit)));
        // The target really has two paths: the whole sequence in one forward would disagree.
        target.reset();
        let rows: Vec<u32> = prompt
            .iter()
            .chain(&chain[..chain.len() - 1])
            .copied()
            .collect();
        let positions: Vec<usize> = (0..rows.len()).collect();
        let out = target.forward(&rows, &positions, &[]).unwrap();
        let long = fastdecode_cpu::ops::argmax(
            &out.logits[(prompt.len() - 1) * vocab as usize..][..vocab as usize],
        );
        assert_ne!(long as u32, chain[0]);
    }

    #[test]
    fn the_drafter_knob_takes_0_and_1_and_refuses_the_rest_by_name() {
        assert!(drafter_knob(None).unwrap());
        assert!(drafter_knob(Some("")).unwrap());
        assert!(drafter_knob(Some("1")).unwrap());
        assert!(!drafter_knob(Some("0")).unwrap());
        let msg = drafter_knob(Some("off")).unwrap_err().to_string();
        assert!(
            msg.contains("FASTDECODE_WORKER_DRAFTER")
                && msg.contains("\"off\"")
                && msg.contains("0, 1"),
            "{msg}"
        );
    }
}
