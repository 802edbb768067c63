//! `fastdecode-faulty`: the real `fastdecode worker` with one fault injected, chosen by the
//! `FASTDECODE_FAULT` environment variable. Test-only (the `fault-injection` feature builds it):
//! the tests run it as a candidate build to show that the gate and the clock report each fault as
//! what it is. The faults sit between the worker and its stdout, so the engine itself is untouched.
//!
//! Faults: `crash` (exits mid-window), `hang` (stops mid-window), `wrong_token@K` (emits a wrong
//! token at step K of every window), `wrong_drafter@K` (the same, only in windows drafted by the
//! drafter: a build exact under the oracle's forced rejections but not with its own drafter), `wrong_replay@K` (a wrong argmax at replay step K),
//! `lie_count` (drops a token), `lie_vocab` (a token id past the vocabulary), `lie_kv` (a KV length
//! off by one), `slow=F` (every window takes F times as long), `shift` (says `seeded` only when
//! the whole window is decoded: a build that moves its decode before the prefill's end, which
//! a clock that split the window at `seeded` would price as an infinitely fast decode).

#[path = "worker.rs"]
mod worker;

use std::io::{BufReader, Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

use fastdecode_worker::Reply;

#[derive(Parser)]
#[command(
    name = "fastdecode-faulty",
    about = "fastdecode worker with an injected fault (tests only)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    Worker(worker::WorkerArgs),
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    Crash,
    Hang,
    WrongToken(usize),
    WrongDrafter(usize),
    WrongReplay(usize),
    LieCount,
    LieVocab,
    LieKv,
    Slow(f64),
    Shift,
}

fn parse_fault(s: &str) -> Result<Fault> {
    let at = |p: &str| -> Result<usize> {
        s[p.len()..]
            .parse()
            .with_context(|| format!("FASTDECODE_FAULT={s}"))
    };
    Ok(match s {
        "crash" => Fault::Crash,
        "hang" => Fault::Hang,
        "lie_count" => Fault::LieCount,
        "lie_vocab" => Fault::LieVocab,
        "lie_kv" => Fault::LieKv,
        "shift" => Fault::Shift,
        _ if s.starts_with("wrong_token@") => Fault::WrongToken(at("wrong_token@")?),
        _ if s.starts_with("wrong_drafter@") => Fault::WrongDrafter(at("wrong_drafter@")?),
        _ if s.starts_with("wrong_replay@") => Fault::WrongReplay(at("wrong_replay@")?),
        _ if s.starts_with("slow=") => Fault::Slow(
            s["slow=".len()..]
                .parse()
                .with_context(|| format!("FASTDECODE_FAULT={s}"))?,
        ),
        _ => bail!("FASTDECODE_FAULT={s}: unknown fault"),
    })
}

/// Stdin that remembers when the last request arrived, and whether it asked for the drafter.
struct Stamped {
    last: Arc<Mutex<Instant>>,
    line: Vec<u8>,
    drafter: Arc<Mutex<bool>>,
}

impl Read for Stamped {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = std::io::stdin().read(buf)?;
        *self.last.lock().expect("not poisoned") = Instant::now();
        for &b in &buf[..n] {
            if b != b'\n' {
                self.line.push(b);
                continue;
            }
            let req: serde_json::Value = serde_json::from_slice(&self.line).unwrap_or_default();
            *self.drafter.lock().expect("not poisoned") = req["draft"] == "drafter";
            self.line.clear();
        }
        Ok(n)
    }
}

/// Stdout that rewrites reply lines according to the fault.
struct Filter {
    fault: Fault,
    buf: Vec<u8>,
    request_at: Arc<Mutex<Instant>>,
    last_out: Instant,
    vocab: u32,
    /// Whether the request being served asked for the drafter.
    drafter: Arc<Mutex<bool>>,
    /// `shift`: the `seeded` line held back until the window's end.
    held: Option<Reply>,
}

impl Filter {
    fn emit(&mut self, mut r: Reply) -> std::io::Result<()> {
        match (&mut r, self.fault) {
            (Reply::Ready(ready), _) => self.vocab = ready.vocab_size as u32,
            (Reply::Seeded { .. }, Fault::Crash) => std::process::exit(3),
            (Reply::Seeded { .. }, Fault::Hang) => loop {
                std::thread::sleep(Duration::from_secs(3600));
            },
            (Reply::Seeded { token, .. }, Fault::WrongToken(0)) => {
                *token = (*token + 1) % self.vocab
            }
            (Reply::Window { tokens, .. }, Fault::WrongToken(k)) if k < tokens.len() => {
                tokens[k] = (tokens[k] + 1) % self.vocab
            }
            (Reply::Window { tokens, .. }, Fault::WrongDrafter(k))
                if k < tokens.len() && *self.drafter.lock().expect("not poisoned") =>
            {
                tokens[k] = (tokens[k] + 1) % self.vocab
            }
            (Reply::Replay { steps, .. }, Fault::WrongReplay(k)) if k < steps.len() => {
                let t = &mut steps[k].top;
                t[0].id = (0..self.vocab)
                    .find(|&i| i != t[0].id && i != t[1].id)
                    .expect("vocab > 2");
            }
            (Reply::Window { tokens, .. }, Fault::LieCount) => {
                tokens.pop();
            }
            (Reply::Window { tokens, .. }, Fault::LieVocab) => {
                if let Some(t) = tokens.last_mut() {
                    *t = self.vocab + 7;
                }
            }
            (Reply::Window { kv_len, .. }, Fault::LieKv) => *kv_len += 1,
            (Reply::Seeded { .. }, Fault::Shift) => {
                self.held = Some(r);
                return Ok(());
            }
            (Reply::Window { .. }, Fault::Shift) => {
                if let Some(seeded) = self.held.take() {
                    self.send(&seeded)?;
                }
            }
            (Reply::Seeded { .. }, Fault::Slow(f)) => {
                let since = self.request_at.lock().expect("not poisoned").elapsed();
                std::thread::sleep(since.mul_f64(f - 1.0));
            }
            (Reply::Window { .. }, Fault::Slow(f)) => {
                std::thread::sleep(self.last_out.elapsed().mul_f64(f - 1.0))
            }
            _ => {}
        }
        self.send(&r)
    }

    fn send(&mut self, r: &Reply) -> std::io::Result<()> {
        let line = serde_json::to_string(r).map_err(std::io::Error::other)? + "\n";
        let mut out = std::io::stdout().lock();
        out.write_all(line.as_bytes())?;
        out.flush()?;
        self.last_out = Instant::now();
        Ok(())
    }
}

impl Write for Filter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        while let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=i).collect();
            let r: Reply = serde_json::from_slice(&line).map_err(std::io::Error::other)?;
            self.emit(r)?;
        }
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn main() {
    let Cmd::Worker(args) = Cli::parse().cmd;
    let result = (|| -> Result<()> {
        let fault = parse_fault(
            &std::env::var("FASTDECODE_FAULT").context("FASTDECODE_FAULT is not set")?,
        )?;
        let request_at = Arc::new(Mutex::new(Instant::now()));
        let drafter = Arc::new(Mutex::new(false));
        let input = BufReader::new(Stamped {
            last: request_at.clone(),
            line: vec![],
            drafter: drafter.clone(),
        });
        let output = Filter {
            fault,
            buf: vec![],
            request_at,
            last_out: Instant::now(),
            vocab: 0,
            drafter,
            held: None,
        };
        worker::serve(args, input, output)
    })();
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
