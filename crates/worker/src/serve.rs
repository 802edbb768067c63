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

use crate::client::ModelSource;

use crate::protocol::{
    Build, Ready, ReplayRequest, Reply, Request, Scored, Step, WindowRequest, PROTOCOL, VERSION,
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

/// Rows per forward in a replay: bounds the logits held at once (rows × vocab) on large models.
const REPLAY_CHUNK: usize = 64;

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

/// Whether a CUDA worker loads the GPU drafter (developer knob `FASTDECODE_WORKER_DRAFTER=0`:
/// serial and oracle windows need none, and the drafter's memory and warm-up are then spared).
fn gpu_drafter_wanted() -> Result<bool> {
    drafter_knob(std::env::var("FASTDECODE_WORKER_DRAFTER").ok().as_deref())
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
    let (engine, digest) = load(opts)?;
    let mut server = Server { engine };
    server.warm()?;
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

struct Server {
    engine: Engine,
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
    fn warm(&mut self) -> Result<()> {
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
        w.block_size = 4;
        w.draft = Some("oracle:0.5".into());
        w.drafts = Some(fastdecode_engine::oracle::realise(
            &tokens,
            0.5,
            vocab as usize,
            0,
        )?);
        self.window(&w, &mut sink)?;
        self.replay(&ReplayRequest {
            id: 0,
            prompt: prompt.clone(),
            chain: tokens,
            probe: true,
        })?;
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
        let n = r.chain.len();
        let (target, _) = self.target_and_source(None, 1)?;
        target.reset();
        let vocab = target.config().vocab_size;
        // Step i is the distribution at row prompt.len() - 1 + i of prompt ++ chain[..n-1].
        let rows: Vec<u32> = r
            .prompt
            .iter()
            .chain(&r.chain[..n.saturating_sub(1)])
            .copied()
            .collect();
        let first = r.prompt.len() - 1;
        let mut steps = Vec::with_capacity(n);
        let mut start = 0;
        while start < rows.len() && steps.len() < n {
            let end = (start + REPLAY_CHUNK).min(rows.len());
            let positions: Vec<usize> = (start..end).collect();
            let out = target.forward(&rows[start..end], &positions, &[])?;
            for (j, logits) in out.logits.chunks_exact(vocab).enumerate() {
                let row = start + j;
                if row < first {
                    continue;
                }
                let i = row - first;
                let [(a, la), (b, lb)] = top2(logits);
                steps.push(Step {
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
                    probe_logit: if r.probe {
                        let t = r.chain[i] as usize;
                        Some(*logits.get(t).with_context(|| {
                            format!("replay: chain token {t} at step {i} is outside the vocabulary")
                        })?)
                    } else {
                        None
                    },
                });
            }
            start = end;
        }
        Ok(steps)
    }
}

#[cfg(test)]
mod tests {
    use super::drafter_knob;

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
