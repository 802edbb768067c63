//! The worker's side: load, verify and warm a model, say `ready`, then serve requests until
//! `shutdown` or end of input. Nothing here reads a clock: the parent times the windows.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::str::FromStr;

use anyhow::{bail, Context, Result};

use fastdecode_cpu::flags::{self, Flags};
use fastdecode_cpu::ops::top2;
use fastdecode_engine::session::{draft_source, max_block};
use fastdecode_engine::{
    generate_observed, CpuTarget, DecodeOptions, DraftPlan, DraftSpec, LoadedModel, TargetBackend,
};
use fastdecode_model::manifest;

use crate::protocol::{
    Build, Ready, ReplayRequest, Reply, Request, Scored, Step, WindowRequest, PROTOCOL, VERSION,
};

/// Which compute backend serves the requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The f32 reference engine.
    Cpu,
}

impl FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "cpu" => Ok(Backend::Cpu),
            other => Err(format!("unknown backend {other:?} (known: cpu)")),
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backend::Cpu => write!(f, "cpu"),
        }
    }
}

impl Backend {
    fn target(self, model: &LoadedModel, max_block: usize) -> Box<dyn TargetBackend> {
        match self {
            Backend::Cpu => Box::new(CpuTarget::new(model.target.clone(), max_block)),
        }
    }
}

pub struct WorkerOptions {
    pub model: PathBuf,
    pub backend: Backend,
    pub flags: Flags,
}

/// Rows per forward in a replay: bounds the logits held at once (rows × vocab) on large models.
const REPLAY_CHUNK: usize = 64;

fn write_line(out: &mut impl Write, reply: &Reply) -> std::io::Result<()> {
    let line = serde_json::to_string(reply).map_err(std::io::Error::other)?;
    out.write_all(line.as_bytes())?;
    out.write_all(b"\n")?;
    out.flush()
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
    let verified = manifest::verify(&opts.model, &indicatif::ProgressBar::hidden())
        .with_context(|| format!("{}: model verification", opts.model.display()))?;
    let model = LoadedModel::load(&opts.model)?;
    let server = Server {
        model: &model,
        backend: opts.backend,
    };
    server.warm()?;
    let ready = Ready {
        protocol: PROTOCOL.into(),
        version: VERSION,
        build,
        backend: opts.backend.to_string(),
        flags: opts.flags.names().iter().map(|s| s.to_string()).collect(),
        known_flags: flags::ALL.iter().map(|f| f.name.to_string()).collect(),
        model_digest: verified.digest,
        vocab_size: model.target.cfg.vocab_size,
        max_block: max_block(&model, DraftSpec::Oracle(0.0)),
    };
    write_line(&mut output, &Reply::Ready(ready))?;
    // The longest request a parent can need: three token lists (prompt, chain or truth) of the
    // model's longest sequence. A longer line is refused without being held.
    let max_line = model
        .target
        .cfg
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
            Ok((false, l)) => match serde_json::from_str(l) {
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

struct Server<'a> {
    model: &'a LoadedModel,
    backend: Backend,
}

impl Server<'_> {
    /// Runs each kind of request once on a short prompt so first-touch costs (page faults,
    /// allocator growth) fall before `ready`.
    fn warm(&self) -> Result<()> {
        let vocab = self.model.target.cfg.vocab_size as u32;
        let prompt: Vec<u32> = (0..16u32).map(|i| (i * 7 + 1) % vocab).collect();
        let mut sink = std::io::sink();
        let mut w = WindowRequest {
            id: 0,
            prompt: prompt.clone(),
            decode_tokens: 8,
            block_size: 1,
            draft: None,
            seed: 0,
            truth: None,
        };
        let Reply::Window { tokens, .. } = self.window(&w, &mut sink)? else {
            bail!("warm-up: a window did not end in a window reply");
        };
        w.block_size = 4;
        w.draft = Some("oracle:0.5".into());
        w.truth = Some(tokens.clone());
        self.window(&w, &mut sink)?;
        self.replay(&ReplayRequest {
            id: 0,
            prompt,
            chain: tokens,
            probe: true,
        })?;
        Ok(())
    }

    /// Serves a window; writes the `seeded` line itself, mid-window, and returns the final reply.
    fn window(&self, w: &WindowRequest, out: &mut impl Write) -> Result<Reply> {
        if w.block_size == 0 {
            bail!("block_size must be at least 1");
        }
        let mut source = if w.block_size > 1 {
            let spec: DraftSpec = w
                .draft
                .as_deref()
                .context("a window with block_size > 1 needs a draft source")?
                .parse()
                .map_err(anyhow::Error::msg)?;
            let plan = DraftPlan {
                block_size: w.block_size,
                source: spec,
                seed: w.seed,
            };
            Some(draft_source(
                self.model,
                &w.prompt,
                plan,
                w.truth.as_deref(),
            )?)
        } else {
            None
        };
        let mut target = self.backend.target(self.model, w.block_size);
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
            target.as_mut(),
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

    fn replay(&self, r: &ReplayRequest) -> Result<Vec<Step>> {
        if r.prompt.is_empty() {
            bail!("replay: the prompt must have at least one token");
        }
        let n = r.chain.len();
        let mut target = self.backend.target(self.model, 1);
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
