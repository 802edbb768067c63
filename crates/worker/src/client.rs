//! The parent's side of the protocol. The parent owns the clock: a window is timed from the moment
//! its request is written to the moment its reply line is read, split at the `seeded` line into
//! prefill and decode. Every reply is checked against the parent's own ledger, and anything a
//! worker does wrong comes back as a `Fault`: infrastructure (it crashed, hung, stalled or spoke
//! garbage) or a violation (its reply is impossible), never as a number that could be scored.

use std::io::{BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStderr, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::lines::{read_line, Bounded};

use crate::protocol::{
    ModelSource, Ready, ReplayRequest, Reply, Request, Step, WindowRequest, PROTOCOL, VERSION,
};

/// How to start a worker: `BIN worker MODEL-ARGS --backend BACKEND [--flags FLAGS]`.
#[derive(Debug, Clone)]
pub struct Spec {
    pub bin: PathBuf,
    pub model: ModelSource,
    pub backend: String,
    /// Optimisation flags to switch on (`None`: the worker's own default, from its environment).
    pub flags: Option<String>,
    /// Longest wait for `ready` (load, verify, warm-up).
    pub ready_timeout: Duration,
    /// Longest wait for any one reply.
    pub request_timeout: Duration,
    /// Whether the worker's windows may draft with the model's own drafter. When not, the worker
    /// is told (`DRAFTER_VAR=0`) to load none, which spares its memory and seconds of start-up;
    /// a build that ignores it only starts slower.
    pub drafter: bool,
}

/// What a worker did wrong. `category()` is the redacted name a report may show.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Fault {
    #[error("infra:{kind}: {detail}")]
    Infra { kind: &'static str, detail: String },
    #[error("violation:{kind}: {detail}")]
    Violation { kind: &'static str, detail: String },
}

impl Fault {
    fn infra(kind: &'static str, detail: impl Into<String>) -> Self {
        Fault::Infra {
            kind,
            detail: detail.into(),
        }
    }
    fn violation(kind: &'static str, detail: impl Into<String>) -> Self {
        Fault::Violation {
            kind,
            detail: detail.into(),
        }
    }
    /// `infra:worker_hung`, `violation:kv_ledger`, ...
    pub fn category(&self) -> String {
        match self {
            Fault::Infra { kind, .. } => format!("infra:{kind}"),
            Fault::Violation { kind, .. } => format!("violation:{kind}"),
        }
    }
    pub fn is_infra(&self) -> bool {
        matches!(self, Fault::Infra { .. })
    }
}

/// Called while the parent waits on a window: telemetry sampling and the stall guard.
pub trait Tick {
    /// How long to wait between calls.
    fn interval(&self) -> Duration;
    /// One sample of the worker with this pid; `Err(reason)` declares it stalled.
    fn tick(&mut self, pid: u32) -> Result<(), String>;
}

/// No sampling: wait for replies without interruption.
pub struct NoTick;

impl Tick for NoTick {
    fn interval(&self) -> Duration {
        Duration::from_secs(3600)
    }
    fn tick(&mut self, _pid: u32) -> Result<(), String> {
        Ok(())
    }
}

/// A window as the parent's clock saw it.
#[derive(Debug, Clone)]
pub struct TimedWindow {
    /// Request written → `seeded` read.
    pub prefill_seconds: f64,
    /// `seeded` read → final reply read.
    pub decode_seconds: f64,
    pub tokens: Vec<u32>,
    pub kv_len: usize,
}

enum Line {
    Text(Instant, String),
    /// A line longer than any reply to the pending request can be.
    TooLong(usize),
    Eof,
}

/// Longest line a reply carries besides its tokens or steps (an error message, `ready`).
const LINE_BASE: usize = 64 << 10;
/// Bytes a window reply may spend per token: a u32 and a comma.
const LINE_PER_TOKEN: usize = 16;
/// Bytes a replay reply may spend per step: two scored ids and a probe logit.
const LINE_PER_STEP: usize = 192;
/// Lines the reader thread may hold for the parent: a request has at most two replies, so a
/// worker that sends more than this is misbehaving and waits until the parent gives up on it.
const QUEUED_LINES: usize = 8;
/// Bytes of the worker's stderr kept for a fault's detail.
const STDERR_TAIL: usize = 4096;
/// Bytes of the worker's stderr passed on to the parent's: a candidate's diagnostics are worth a
/// screen or two; beyond that they would bury the parent's own report (and fill a log).
const STDERR_RELAYED: usize = 64 << 10;

/// A running worker process and the process group it leads; both are killed when dropped.
pub struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<Line>,
    /// The longest reply line the reader accepts now, set for each request.
    line_limit: Arc<AtomicUsize>,
    /// The end of what the worker wrote to stderr (which is passed on to the parent's).
    stderr_tail: Arc<Mutex<Vec<u8>>>,
    /// Told when the worker's stderr ends, so a crash report can wait for its last words.
    stderr_done: Receiver<()>,
    pub ready: Ready,
    vocab: usize,
    next_id: u64,
    request_timeout: Duration,
}

/// Has process `pid` exited? Asked without reaping it: until it is reaped its pid, which is also
/// its process group's id, cannot be reused, so killing the group stays safe. The answer says
/// how it ended.
#[cfg(unix)]
fn exited(pid: u32) -> Option<String> {
    // SAFETY: waitid writes only into `info`, which is zeroed plain data.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let r = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // SAFETY: for a child reported by waitid the pid and status fields are set.
    let (who, status) = unsafe { (info.si_pid(), info.si_status()) };
    if r != 0 || who == 0 {
        return None;
    }
    Some(if info.si_code == libc::CLD_EXITED {
        format!("exit status: {status}")
    } else {
        format!("signal: {status}")
    })
}

#[cfg(not(unix))]
fn exited(_pid: u32) -> Option<String> {
    None
}

/// The worker's diagnostics go on to the parent's stderr as they come, in chunks (never a whole
/// line held), up to `STDERR_RELAYED` bytes; the last few kilobytes are kept in `tail` to say
/// why a worker died. `done` is told when the worker's stderr has ended.
fn relay_stderr(mut stderr: ChildStderr, tail: &Mutex<Vec<u8>>, done: &mpsc::Sender<()>) {
    let mut buf = [0u8; 8192];
    let (mut relayed, mut held_back) = (0usize, 0u64);
    let mut ends_line = true;
    while let Ok(n) = stderr.read(&mut buf) {
        if n == 0 {
            break;
        }
        let shown = n.min(STDERR_RELAYED - relayed);
        if shown > 0 {
            let _ = std::io::stderr().write_all(&buf[..shown]);
            ends_line = buf[shown - 1] == b'\n';
        }
        relayed += shown;
        held_back += (n - shown) as u64;
        let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
        t.extend_from_slice(&buf[..n]);
        let excess = t.len().saturating_sub(STDERR_TAIL);
        t.drain(..excess);
    }
    // The parent's own messages start on a line of their own.
    let newline = if ends_line { "" } else { "\n" };
    let cut = if held_back > 0 {
        format!("[the worker's stderr: {held_back} more byte(s) not shown]\n")
    } else {
        String::new()
    };
    let _ = write!(std::io::stderr(), "{newline}{cut}");
    let _ = done.send(());
}

impl Worker {
    /// Starts a worker and waits for its `ready` line. `vocab` and `digest` are what the parent
    /// knows of the model (its config and MANIFEST): a worker claiming otherwise is a violation.
    pub fn spawn(spec: &Spec, vocab: usize, digest: &str) -> Result<Worker, Fault> {
        let mut cmd = Command::new(&spec.bin);
        cmd.arg("worker")
            .args(spec.model.worker_args())
            .arg("--backend")
            .arg(&spec.backend);
        if let Some(f) = &spec.flags {
            cmd.arg("--flags").arg(f);
        }
        if !spec.drafter {
            cmd.env(crate::protocol::DRAFTER_VAR, "0");
        }
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            // Its own process group: whatever the worker starts dies with it (`kill_group`).
            cmd.process_group(0);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                Fault::infra(
                    "spawn_failed",
                    format!("cannot start {}: {e}", spec.bin.display()),
                )
            })?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let line_limit = Arc::new(AtomicUsize::new(LINE_BASE));
        let (tx, lines) = mpsc::sync_channel(QUEUED_LINES);
        let limit = line_limit.clone();
        // The reader stamps each line the moment it is read: that stamp is the clock's reading.
        // It holds at most one line, of at most the current limit.
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let max = || limit.load(Ordering::Acquire);
            loop {
                let msg = match read_line(&mut r, max) {
                    Ok(Bounded::Line(l)) => {
                        Line::Text(Instant::now(), String::from_utf8_lossy(&l).into_owned())
                    }
                    Ok(Bounded::TooLong) => Line::TooLong(max()),
                    Ok(Bounded::Eof) | Err(_) => Line::Eof,
                };
                let last = !matches!(msg, Line::Text(..));
                if tx.send(msg).is_err() || last {
                    return;
                }
            }
        });
        let stderr_tail = Arc::new(Mutex::new(vec![]));
        let (done_tx, stderr_done) = mpsc::channel();
        let tail = stderr_tail.clone();
        std::thread::spawn(move || relay_stderr(stderr, &tail, &done_tx));
        let mut w = Worker {
            child,
            stdin,
            lines,
            line_limit,
            stderr_tail,
            stderr_done,
            ready: Ready {
                protocol: String::new(),
                version: 0,
                build: crate::protocol::Build {
                    version: String::new(),
                    commit: String::new(),
                },
                backend: String::new(),
                flags: vec![],
                known_flags: vec![],
                model_digest: String::new(),
                vocab_size: 0,
                max_block: 0,
            },
            vocab,
            next_id: 1,
            request_timeout: spec.request_timeout,
        };
        let deadline = Instant::now() + spec.ready_timeout;
        let (_, reply) = w.recv(deadline, &mut NoTick)?;
        let Reply::Ready(ready) = reply else {
            return Err(Fault::infra("protocol", "the first line was not `ready`"));
        };
        if ready.protocol != PROTOCOL || ready.version != VERSION {
            return Err(Fault::infra(
                "protocol",
                format!(
                    "worker speaks {} v{}, this parent {PROTOCOL} v{VERSION}",
                    ready.protocol, ready.version
                ),
            ));
        }
        if ready.model_digest != digest {
            return Err(Fault::violation(
                "weights_digest",
                format!(
                    "worker loaded model digest {}, expected {digest}",
                    ready.model_digest
                ),
            ));
        }
        if ready.vocab_size != vocab {
            return Err(Fault::violation(
                "model_shape",
                format!(
                    "worker reports vocabulary {}, the model has {vocab}",
                    ready.vocab_size
                ),
            ));
        }
        w.ready = ready;
        Ok(w)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a request, first bounding the reply lines the reader accepts to what a reply to it
    /// can need.
    fn send(&mut self, req: &Request) -> Result<(), Fault> {
        let limit = match req {
            Request::Window(w) => w
                .decode_tokens
                .saturating_add(1)
                .saturating_mul(LINE_PER_TOKEN),
            Request::Replay(r) => r.chain.len().saturating_mul(LINE_PER_STEP),
            Request::Shutdown => 0,
        };
        self.line_limit
            .store(LINE_BASE.saturating_add(limit), Ordering::Release);
        let line = serde_json::to_string(req).expect("requests serialise");
        let r = self
            .stdin
            .write_all(line.as_bytes())
            .and_then(|_| self.stdin.write_all(b"\n"))
            .and_then(|_| self.stdin.flush());
        r.map_err(|_| self.crashed())
    }

    /// Kills the worker and every process it started (its process group).
    fn kill_group(&mut self) {
        #[cfg(unix)]
        // SAFETY: a signal to the group this worker leads; its pid is not reaped yet (every
        // wait here is `exited`'s, which does not reap), so the group id is still its own.
        unsafe {
            libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL);
        }
        let _ = self.child.kill();
    }

    /// The worker's last error line on stderr (else its last line), once its stderr has ended.
    /// Called when the worker's process group is killed, so the end comes as soon as the relay
    /// has read what the pipe still held (and the relay's own last lines are out before the
    /// caller reports); the bound is for a process that left the group and holds the pipe.
    fn last_words(&self) -> Option<String> {
        let _ = self.stderr_done.recv_timeout(Duration::from_secs(5));
        let t = self.stderr_tail.lock().unwrap_or_else(|e| e.into_inner());
        let text = String::from_utf8_lossy(&t);
        let mut lines = text.lines().rev().map(str::trim).filter(|l| !l.is_empty());
        let last = lines.clone().next()?;
        let line = lines.find(|l| l.starts_with("error")).unwrap_or(last);
        Some(line.chars().take(500).collect())
    }

    /// The worker's output ended (or a write to it failed): collect how it died.
    fn crashed(&mut self) -> Fault {
        let deadline = Instant::now() + Duration::from_secs(2);
        let how = loop {
            match exited(self.child.id()) {
                Some(how) => break format!("worker exited ({how})"),
                None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                None => break "worker closed its output".to_string(),
            }
        };
        self.kill_group();
        match self.last_words() {
            Some(w) => Fault::infra("worker_crashed", format!("{how}; it said: {w}")),
            None => Fault::infra("worker_crashed", how),
        }
    }

    /// The next reply line before `deadline`, calling `tick` between waits.
    fn recv(&mut self, deadline: Instant, tick: &mut dyn Tick) -> Result<(Instant, Reply), Fault> {
        loop {
            let now = Instant::now();
            if now >= deadline {
                self.kill_group();
                return Err(Fault::infra("worker_hung", "no reply before the timeout"));
            }
            let wait = tick.interval().min(deadline - now);
            match self.lines.recv_timeout(wait) {
                Ok(Line::Text(at, text)) => {
                    let reply = Reply::parse(&text).map_err(|e| {
                        Fault::infra("protocol", format!("unparseable reply line: {e}"))
                    })?;
                    if let Reply::Error { message, .. } = &reply {
                        return Err(Fault::infra("worker_error", message.clone()));
                    }
                    return Ok((at, reply));
                }
                Ok(Line::TooLong(max)) => {
                    self.kill_group();
                    return Err(Fault::infra(
                        "protocol",
                        format!("a reply line longer than {max} bytes, more than this request's reply can be"),
                    ));
                }
                Ok(Line::Eof) | Err(RecvTimeoutError::Disconnected) => return Err(self.crashed()),
                Err(RecvTimeoutError::Timeout) => {
                    if let Err(why) = tick.tick(self.child.id()) {
                        self.kill_group();
                        return Err(Fault::infra("worker_stalled", why));
                    }
                }
            }
        }
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<(), Fault> {
        if let Some((i, t)) = tokens
            .iter()
            .enumerate()
            .find(|(_, &t)| t as usize >= self.vocab)
        {
            return Err(Fault::violation(
                "token_out_of_vocab",
                format!("token {i} has id {t}, the vocabulary is 0..{}", self.vocab),
            ));
        }
        Ok(())
    }

    /// Runs one timed window. The request's `id` is assigned here.
    pub fn window(
        &mut self,
        mut req: WindowRequest,
        tick: &mut dyn Tick,
    ) -> Result<TimedWindow, Fault> {
        req.id = self.next_id;
        self.next_id += 1;
        let deadline = Instant::now() + self.request_timeout;
        let (p, n) = (req.prompt.len(), req.decode_tokens);
        let id = req.id;
        let t0 = Instant::now();
        self.send(&Request::Window(req))?;
        let (t1, seeded) = self.recv(deadline, &mut *tick)?;
        let Reply::Seeded {
            id: sid,
            token,
            kv_len,
        } = seeded
        else {
            return Err(Fault::infra(
                "protocol",
                "a window's first reply was not `seeded`",
            ));
        };
        let (t2, done) = self.recv(deadline, tick)?;
        let Reply::Window {
            id: wid,
            tokens,
            kv_len: final_kv,
        } = done
        else {
            return Err(Fault::infra(
                "protocol",
                "a window did not end with a `window` reply",
            ));
        };
        if sid != id || wid != id {
            return Err(Fault::infra(
                "protocol",
                format!("replies for request {sid}/{wid}, expected {id}"),
            ));
        }
        if tokens.len() != n.saturating_add(1) {
            return Err(Fault::violation(
                "token_count",
                format!("{} tokens for a window of 1 + {n}", tokens.len()),
            ));
        }
        self.check_tokens(&tokens)?;
        if token != tokens[0] {
            return Err(Fault::violation(
                "inconsistent_reply",
                "the seeded token differs from the window's first token",
            ));
        }
        // The ledger: the prompt, then every emitted token but the last (not yet run).
        if kv_len != p {
            return Err(Fault::violation(
                "kv_ledger",
                format!("after the prefill the KV length is {kv_len}, the ledger says {p}"),
            ));
        }
        if final_kv != p.saturating_add(n) {
            return Err(Fault::violation(
                "kv_ledger",
                format!(
                    "after the window the KV length is {final_kv}, the ledger says {} (prompt {p} + tokens {} - 1)",
                    p + n,
                    n + 1
                ),
            ));
        }
        Ok(TimedWindow {
            prefill_seconds: (t1 - t0).as_secs_f64(),
            decode_seconds: (t2 - t1).as_secs_f64(),
            tokens,
            kv_len: final_kv,
        })
    }

    /// Teacher-forced replay of `chain` after `prompt`; with `probe`, each step also carries the
    /// logit of the chain's own token.
    pub fn replay(
        &mut self,
        prompt: &[u32],
        chain: &[u32],
        probe: bool,
    ) -> Result<Vec<Step>, Fault> {
        let id = self.next_id;
        self.next_id += 1;
        let deadline = Instant::now() + self.request_timeout;
        self.send(&Request::Replay(ReplayRequest {
            id,
            prompt: prompt.to_vec(),
            chain: chain.to_vec(),
            probe,
        }))?;
        let (_, reply) = self.recv(deadline, &mut NoTick)?;
        let Reply::Replay { id: rid, steps } = reply else {
            return Err(Fault::infra(
                "protocol",
                "a replay was not answered with `replay`",
            ));
        };
        if rid != id {
            return Err(Fault::infra(
                "protocol",
                format!("reply for request {rid}, expected {id}"),
            ));
        }
        if steps.len() != chain.len() {
            return Err(Fault::violation(
                "token_count",
                format!(
                    "{} replay steps for a chain of {}",
                    steps.len(),
                    chain.len()
                ),
            ));
        }
        for (i, s) in steps.iter().enumerate() {
            self.check_tokens(&[s.top[0].id, s.top[1].id])?;
            let finite = s.top.iter().all(|t| t.logit.is_finite())
                && s.probe_logit.is_none_or(f32::is_finite);
            if s.top[0].id == s.top[1].id
                || !finite
                || s.top[0].logit < s.top[1].logit
                || s.probe_logit.is_some() != probe
                || s.probe_logit.is_some_and(|l| l > s.top[0].logit)
            {
                return Err(Fault::violation(
                    "inconsistent_reply",
                    format!("replay step {i} is not a valid top-2 (or probe) of one distribution"),
                ));
            }
        }
        Ok(steps)
    }

    /// Asks the worker to exit, and makes sure it has, and that nothing it started lives on.
    pub fn shutdown(mut self) {
        let _ = self.send(&Request::Shutdown);
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline && exited(self.child.id()).is_none() {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill_group();
        let _ = self.child.wait();
    }
}

/// What the parent knows of a model without trusting any worker: its vocabulary and longest
/// sequence (from `config.json`) and its MANIFEST digest (or, for synthetic weights, the
/// preset's digest).
#[derive(Debug, Clone)]
pub struct ModelId {
    pub source: ModelSource,
    pub vocab: usize,
    /// `max_position_embeddings`: no request may run a longer sequence.
    pub max_positions: usize,
    pub digest: String,
}

impl ModelId {
    pub fn of(dir: &std::path::Path) -> anyhow::Result<ModelId> {
        let cfg = fastdecode_model::LagunaConfig::from_file(&dir.join("config.json"))?;
        let mpath = dir.join(fastdecode_model::manifest::MANIFEST);
        let text = fastdecode_model::files::read_text(&mpath)?;
        Ok(ModelId {
            source: ModelSource::Dir(dir.to_path_buf()),
            vocab: cfg.vocab_size,
            max_positions: cfg.max_position_embeddings,
            digest: fastdecode_model::manifest::digest_of(&text),
        })
    }

    /// The model directory, when the model is one (synthetic weights have none).
    pub fn dir(&self) -> Option<&std::path::Path> {
        match &self.source {
            ModelSource::Dir(d) => Some(d),
            ModelSource::Synthetic { .. } => None,
        }
    }

    /// A preset's synthetic weights at `seed` (generated by the worker, never on disk).
    pub fn synthetic(preset: &str, seed: u64) -> anyhow::Result<ModelId> {
        let p = fastdecode_model::synth::preset(preset)?;
        Ok(ModelId {
            source: ModelSource::Synthetic {
                preset: p.name.to_string(),
                seed,
            },
            vocab: p.target.vocab_size,
            max_positions: p.target.max_position_embeddings,
            digest: fastdecode_model::synth::synthetic_digest(preset, seed)?,
        })
    }
}
