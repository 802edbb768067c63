//! The review stage: built-in rules over the lines a bundle adds, then an optional external
//! reviewer command. The rules flag the benchmark bypasses `challenge.md` lists: reading
//! goldens, hidden prompts or other files at run time, detecting the timed phase or touching
//! the clock, caching outputs across calls, skipping verify work, pruning lm_head rows, network
//! or process escapes. A finding fails the submission (the solver's fault); a reviewer that
//! cannot be run, times out or answers nonsense is `infra:review_unavailable`, never a finding.

use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub struct Rule {
    pub name: &'static str,
    /// Any of these in an added line (code, not a `//` comment) is the finding.
    pub needles: &'static [&'static str],
    pub why: &'static str,
}

pub const RULES: &[Rule] = &[
    Rule {
        name: "reads_files",
        needles: &[
            "std::fs",
            "File::open",
            "read_to_string(",
            "include_bytes!",
            "include_str!",
            "golden",
            "hidden",
        ],
        why: "reads files (goldens, hidden prompts, caches) at run time",
    },
    Rule {
        name: "clock",
        needles: &[
            "Instant",
            "SystemTime",
            "std::time",
            "clock_gettime",
            "_rdtsc",
            "getrusage",
        ],
        why: "touches the clock or timers (detecting the timed phase)",
    },
    Rule {
        name: "output_cache",
        needles: &[
            "static mut",
            "thread_local!",
            "lazy_static",
            "OnceLock",
            "OnceCell",
            "LazyLock",
            "AtomicPtr",
            "AtomicUsize",
            "AtomicU64",
            "AtomicU32",
            "AtomicI64",
            "AtomicBool",
        ],
        why: "keeps state across calls (caching outputs, counting calls to find the timed window)",
    },
    Rule {
        name: "escape",
        needles: &[
            "std::net",
            "TcpStream",
            "UdpSocket",
            "std::process",
            "Command::new",
            "libc::",
            "std::env",
            "env!(",
            "asm!",
        ],
        why: "reaches outside the engine (network, processes, environment)",
    },
    Rule {
        name: "verify_skip",
        needles: &["skip_verify", "accept_all", "trust_draft"],
        why: "skips verify work",
    },
    Rule {
        name: "lm_head_pruning",
        needles: &["lm_head.truncate", "vocab_limit", "prune"],
        why: "prunes lm_head rows",
    },
];

/// Lines of `new` that `old` does not have (as a multiset: a line moved is not added).
pub fn added_lines<'a>(old: &str, new: &'a str) -> Vec<&'a str> {
    let mut have: HashMap<&str, usize> = HashMap::new();
    for l in old.lines() {
        *have.entry(l.trim()).or_default() += 1;
    }
    new.lines()
        .filter(|l| match have.get_mut(l.trim()) {
            Some(n) if *n > 0 => {
                *n -= 1;
                false
            }
            _ => true,
        })
        .collect()
}

/// The first built-in finding over the changed files `(path, base text, new text)`:
/// `(rule name, public detail)`.
pub fn builtin(files: &[(String, String, String)]) -> Option<(&'static str, String)> {
    for (path, old, new) in files {
        for line in added_lines(old, new) {
            let code = line.split("//").next().unwrap_or("");
            for r in RULES {
                if let Some(n) = r.needles.iter().find(|n| code.contains(**n)) {
                    return Some((r.name, format!("{path}: an added line {} ({n})", r.why)));
                }
            }
        }
    }
    None
}

/// What the external reviewer said.
#[derive(Debug, PartialEq)]
pub enum External {
    Approved,
    /// Exit status 1: a finding, with the first line of its output.
    Finding(String),
    /// Anything else: the reviewer is not available (infra).
    Unavailable(String),
}

/// Runs `sh -c command` with the unified changes on its stdin; exit 0 approves, exit 1 is a
/// finding, anything else (or no answer within `timeout`) an outage.
pub fn external(command: &str, changes: &str, timeout: Duration) -> External {
    let child = Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return External::Unavailable(format!("cannot start the reviewer: {e}")),
    };
    if let Some(mut stdin) = child.stdin.take() {
        // A reviewer that exits without reading is judged by its exit status alone.
        let _ = stdin.write_all(changes.as_bytes());
    }
    let t0 = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if t0.elapsed() < timeout => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return External::Unavailable(format!(
                    "the reviewer gave no answer within {} s",
                    timeout.as_secs()
                ));
            }
            Err(e) => return External::Unavailable(format!("waiting for the reviewer: {e}")),
        }
    };
    let mut out = String::new();
    if let Some(mut s) = child.stdout.take() {
        use std::io::Read;
        let _ = (&mut s).take(4096).read_to_string(&mut out);
    }
    match status.code() {
        Some(0) => External::Approved,
        Some(1) => External::Finding(out.lines().next().unwrap_or("").trim().to_string()),
        _ => External::Unavailable(format!("the reviewer exited with {status}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(old: &str, new: &str) -> Option<&'static str> {
        builtin(&[("crates/cpu/src/ops.rs".into(), old.into(), new.into())]).map(|(r, _)| r)
    }

    #[test]
    fn the_rules_flag_added_lines_only() {
        let base = "fn f() {\n    let t = std::time::Instant::now();\n}\n";
        // A line the base already had is not a finding; moving it is not either.
        assert_eq!(one(base, base), None);
        assert_eq!(one(base, &format!("// moved\n{base}")), None);
        assert_eq!(
            one(
                base,
                &format!("{base}fn g() {{ let _ = Instant::now(); }}\n")
            ),
            Some("clock")
        );
        assert_eq!(
            one("", "let g = std::fs::read(\"goldens/x\");"),
            Some("reads_files")
        );
        assert_eq!(one("", "static mut CACHE: u32 = 0;"), Some("output_cache"));
        assert_eq!(
            one("", "let s = std::net::TcpStream::connect(a);"),
            Some("escape")
        );
        // Comments are not code.
        assert_eq!(one("", "let x = 1; // no std::fs here"), None);
        // A plain arithmetic change passes.
        assert_eq!(
            one("acc += a * b;", "acc0 += a0 * b;\nacc1 += a1 * b;"),
            None
        );
    }

    #[test]
    fn the_external_reviewer_decides_or_is_unavailable() {
        let t = Duration::from_secs(20);
        assert_eq!(external("cat > /dev/null", "diff", t), External::Approved);
        assert_eq!(
            external(
                "cat > /dev/null; echo 'uses a lookup table'; exit 1",
                "diff",
                t
            ),
            External::Finding("uses a lookup table".into())
        );
        assert!(matches!(
            external("exit 3", "", t),
            External::Unavailable(_)
        ));
        assert!(matches!(
            external("/nonexistent/reviewer", "", t),
            External::Unavailable(_)
        ));
    }
}
