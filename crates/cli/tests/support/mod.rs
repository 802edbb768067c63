//! What the bad-input tests share: the real binary run as a user runs it (with a deadline, its
//! output and its peak memory), a tiny synthetic model made once per test binary, and ways to
//! make broken copies of it without touching the original.

#![allow(dead_code)] // each test binary uses its own part of this module

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Lines, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_fastdecode");

pub fn fd() -> Command {
    Command::new(BIN)
}

/// How a finished process went.
pub struct Out {
    /// The exit code; `None` when a signal ended it.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// Peak resident memory, KiB (`getrusage` of the reaped child).
    pub max_rss_kib: i64,
    pub seconds: f64,
}

impl Out {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }
}

/// Runs `cmd` with `stdin` as its input, killing it (and failing the test) past `limit`.
// The child is reaped by `wait4` (which also reports its peak memory), not by `Child::wait`.
#[allow(clippy::zombie_processes)]
pub fn run_with(cmd: &mut Command, stdin: &[u8], limit: Duration) -> Out {
    let t0 = Instant::now();
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let feeder = std::thread::spawn(move || {
        use std::io::Write;
        let _ = input.write_all(&data);
    });
    let drain = |mut r: Box<dyn Read + Send>| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut v = vec![];
            let _ = r.read_to_end(&mut v);
            let _ = tx.send(String::from_utf8_lossy(&v).into_owned());
        });
        rx
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: plain-data out-parameters of wait4.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: reaps only this child; std's `Child` is never waited on afterwards.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if r == pid {
            break;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            panic!("{cmd:?} ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = feeder.join();
    // Output still open well after the process ended means something it started outlives it.
    let collect = |rx: std::sync::mpsc::Receiver<String>, which: &str| {
        rx.recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| {
                panic!("{cmd:?} exited, but a process it started still holds its {which} open")
            })
    };
    Out {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        stdout: collect(out, "stdout"),
        stderr: collect(err, "stderr"),
        max_rss_kib: usage.ru_maxrss,
        seconds: t0.elapsed().as_secs_f64(),
    }
}

pub fn run(cmd: &mut Command) -> Out {
    run_with(cmd, b"", Duration::from_secs(120))
}

/// Runs a command that must succeed; its stdout.
pub fn ok(cmd: &mut Command) -> String {
    let o = run(cmd);
    assert!(o.ok(), "{cmd:?} failed: {}", o.stderr);
    o.stdout
}

/// A failure as a user should see it: a non-zero exit (not a signal), no panic text.
pub fn assert_clean_failure(what: &str, o: &Out) {
    assert!(
        matches!(o.code, Some(c) if c != 0),
        "{what}: should fail with an exit code, got {:?}\nstdout: {}\nstderr: {}",
        o.code,
        o.stdout,
        o.stderr
    );
    for bad in ["panicked", "RUST_BACKTRACE", "stack backtrace"] {
        assert!(!o.stderr.contains(bad), "{what}: panic text: {}", o.stderr);
    }
}

/// A tiny synthetic model (runtime layout, with drafter, tokenizer and MANIFEST) and the same
/// numbers in the HF layout, made once per test binary. Tests only read them.
pub struct Fixture {
    _tmp: tempfile::TempDir,
    pub model: PathBuf,
    pub hf: PathBuf,
}

pub fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let model = tmp.path().join("tiny");
        let hf = tmp.path().join("tiny-hf");
        ok(fd()
            .args(["synth", "--preset", "tiny", "--seed", "1", "--out"])
            .arg(&model));
        ok(fd()
            .args([
                "synth", "--preset", "tiny", "--seed", "1", "--layout", "hf", "--out",
            ])
            .arg(&hf));
        Fixture {
            _tmp: tmp,
            model,
            hf,
        }
    })
}

/// A `fastdecode worker` on `model`, spoken to as a gate speaks to it: requests on its stdin,
/// one JSON reply a line on its stdout.
pub struct WorkerProcess {
    child: Child,
    pub input: ChildStdin,
    replies: Lines<BufReader<ChildStdout>>,
}

impl WorkerProcess {
    pub fn start(model: &Path) -> WorkerProcess {
        let mut child = fd()
            .arg("worker")
            .arg("--model")
            .arg(model)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        WorkerProcess {
            input: child.stdin.take().unwrap(),
            replies: BufReader::new(child.stdout.take().unwrap()).lines(),
            child,
        }
    }

    /// Sends one request line.
    pub fn send(&mut self, request: &str) {
        writeln!(self.input, "{request}").unwrap();
    }

    pub fn next(&mut self) -> serde_json::Value {
        serde_json::from_str(&self.replies.next().unwrap().unwrap()).unwrap()
    }

    /// Asks the worker to shut down; it must exit with success.
    pub fn shut_down(mut self) {
        self.send(r#"{"op":"shutdown"}"#);
        assert!(self.child.wait().unwrap().success());
    }
}

/// A directory with one golden of the fixture model, made once per test binary. Tests only
/// read it.
pub fn goldens() -> &'static Path {
    static G: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &G.get_or_init(|| {
        let t = tempfile::tempdir().unwrap();
        let g = t.path().join("goldens");
        ok(fd()
            .args(["golden", "make", "--count", "1", "--tokens", "8", "--model"])
            .arg(&fixture().model)
            .arg("--out")
            .arg(&g));
        (t, g)
    })
    .1
}

/// A copy of the directory `src` at `dst` whose files are hard links: cheap, and safe as long
/// as a changed file is replaced (`replace`), never written in place.
pub fn link_copy(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let to = dst.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            link_copy(&e.path(), &to);
        } else {
            std::fs::hard_link(e.path(), &to).unwrap();
        }
    }
}

/// Replaces the file `path` (breaking its hard link) with `bytes`.
pub fn replace(path: &Path, bytes: &[u8]) {
    let _ = std::fs::remove_file(path);
    std::fs::write(path, bytes).unwrap();
}

/// Edits a JSON file (replacing it).
pub fn edit_json(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut v);
    replace(path, serde_json::to_string_pretty(&v).unwrap().as_bytes());
}

/// Writes `bytes` at byte `at` of the data of tensor `name` (of `dtype`) in `file`.
pub fn patch_tensor(file: &Path, name: &str, dtype: safetensors::Dtype, at: usize, bytes: &[u8]) {
    let mut data = std::fs::read(file).unwrap();
    let (header, meta) = safetensors::SafeTensors::read_metadata(&data).unwrap();
    let info = meta.info(name).expect("tensor in the file");
    assert_eq!(info.dtype, dtype, "{name}");
    let at = 8 + header + info.data_offsets.0 + at;
    data[at..at + bytes.len()].copy_from_slice(bytes);
    replace(file, &data);
}

/// Sets element `i` of the BF16 tensor `name` in `file` to the value with bits `bits`.
pub fn patch_bf16(file: &Path, name: &str, i: usize, bits: u16) {
    patch_tensor(
        file,
        name,
        safetensors::Dtype::BF16,
        2 * i,
        &bits.to_le_bytes(),
    );
}

/// Sets byte `i` of the U8 tensor `name` in `file` to `byte`.
pub fn patch_u8(file: &Path, name: &str, i: usize, byte: u8) {
    patch_tensor(file, name, safetensors::Dtype::U8, i, &[byte]);
}

/// Replaces the JSON header of the safetensors `file` by `edit` of its text (trailing padding
/// removed), padded with spaces to a multiple of 8 bytes as safetensors writes it.
pub fn rewrite_header(file: &Path, edit: impl FnOnce(&str) -> String) {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut new = edit(std::str::from_utf8(&bytes[8..8 + n]).unwrap().trim_end());
    while !new.len().is_multiple_of(8) {
        new.push(' ');
    }
    let mut out = (new.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(new.as_bytes());
    out.extend_from_slice(&bytes[8 + n..]);
    replace(file, &out);
}

/// Writes the header entry of tensor `name` in `file` twice (the same key, the same value).
pub fn repeat_header_entry(file: &Path, name: &str) {
    rewrite_header(file, |header| {
        let key = format!("\"{name}\":");
        let at = header.find(&key).expect("tensor in the header");
        // The entry's value is an object without nested objects: it ends at the first '}'.
        let end = at + header[at..].find('}').unwrap() + 1;
        format!("{},{}{}", &header[..end], &header[at..end], &header[end..])
    });
}

/// Makes a FIFO at `path`.
pub fn mkfifo(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "{path:?}");
}

/// Writes an executable shell script.
pub fn script(path: &Path, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Every entry under `dir` with its size and modification time: what "nothing new, nothing
/// changed" is checked against.
pub fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u64, Option<std::time::SystemTime>)> {
    let mut out = BTreeMap::new();
    fn walk(
        root: &Path,
        d: &Path,
        out: &mut BTreeMap<PathBuf, (u64, Option<std::time::SystemTime>)>,
    ) {
        let Ok(rd) = std::fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let p = e.path();
            let m = p.symlink_metadata().unwrap();
            out.insert(
                p.strip_prefix(root).unwrap().to_path_buf(),
                (m.len(), m.modified().ok()),
            );
            if m.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    walk(dir, dir, &mut out);
    out
}

/// Is process `pid` gone (or a zombie nobody reaped yet)?
pub fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state is the field after the parenthesised command name.
        Ok(s) => s
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}
