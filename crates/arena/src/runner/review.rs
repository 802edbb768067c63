//! The review stage: built-in rules over what a bundle adds, then an optional external reviewer
//! command. The rules flag the benchmark bypasses `docs/spec/challenge.md` lists: reading
//! goldens, hidden prompts or other files at run time, detecting the timed phase or touching the
//! clock, caching outputs across calls, skipping verify work, pruning lm_head rows, network or
//! process escapes.
//! A finding fails the submission (the solver's fault); a reviewer that cannot be run, times out
//! or answers nonsense is `infra:review_unavailable`, never a finding.
//!
//! A changed Rust file is read by its syntax tree (`syntax`): every path it names, with `use`
//! renames, groups, globs of `std`/`core`/`alloc` and `extern crate` renames resolved (so
//! `use std::{fs as disk}` then `disk::read` is `std::fs::read`, and `<sp::Command>::new` is
//! `std::process::Command::new`); statics that keep state (`static mut`, or a static holding a
//! `Mutex`, a `Cell`, an atomic, a `Once*`/`Lazy*` or a type of the bundle built on one), and
//! atomics and once-cells wherever they are added (a field keeps state across calls too);
//! `extern` blocks and symbol attributes (`#[link]`, `#[no_mangle]`, `#[export_name]`); the
//! tokens of every macro invocation and `macro_rules!` body (`include_bytes`, `env!`, `asm!`,
//! paths, statics, and a macro that calls a macro its caller names); method calls, identifiers
//! and string literals. What counts is what the bundle adds: the new file's findings less the
//! base file's (as multisets of rule and resolved name), so the engine's own model loading does
//! not fire while one more read of a file does. A Rust file the parser cannot read (or nested
//! past what it reads safely) is `review:unparseable`: what cannot be read cannot be reviewed.
//! Other files on the surface (CUDA sources, TOML) keep the line needles of `RULES`.
//!
//! The review is the first filter, not the wall: it sees names, not behaviour. Code that reaches
//! a file, the clock or the network through the engine's own functions, state kept in the
//! engine's own structures, or raw pointer games are the sandbox's and the protocol's to stop.

use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod names;
mod shape;
mod syntax;

pub struct Rule {
    pub name: &'static str,
    /// Files other than Rust (CUDA, TOML, ...): any of these in an added line (not after a `//`)
    /// is the finding.
    pub needles: &'static [&'static str],
    /// Rust: a path naming any of these, as a run of its segments once aliases are resolved and
    /// `core`/`alloc` read as `std` (`std::fs` flags `std::fs::read`, `Instant` flags
    /// `std::time::Instant`); also a macro so named (`include_bytes!`).
    pub paths: &'static [&'static str],
    /// Rust: macros that count only when invoked by this name (`env!`, not a variable `env`).
    pub macros: &'static [&'static str],
    /// Rust: method calls, `.name` on any receiver or `field.name` on a receiver ending in it.
    pub methods: &'static [&'static str],
    /// Rust: identifiers containing any of these.
    pub idents: &'static [&'static str],
    /// Rust: string literals containing any of these (ignoring case).
    pub literals: &'static [&'static str],
    pub why: &'static str,
}

/// An empty list (for the table below).
const NONE: &[&str] = &[];

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
        paths: &[
            "std::fs",
            "File::open",
            "include_bytes",
            "include_str",
            "std::include",
            "from_file",
            "from_pretrained",
            "memmap2",
            "tokio::fs",
        ],
        macros: &["include"],
        methods: &[".read_to_string", ".read_to_end"],
        idents: NONE,
        literals: &["golden", "hidden/", "/hidden", ".cache/fastdecode"],
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
        paths: &[
            "std::time",
            "Instant",
            "SystemTime",
            "UNIX_EPOCH",
            "clock_gettime",
            "gettimeofday",
            "getrusage",
            "_rdtsc",
            "__rdtscp",
            "CudaEvent",
            "tokio::time",
        ],
        macros: NONE,
        methods: &[".elapsed", ".elapsed_ms", ".duration_since"],
        idents: NONE,
        literals: NONE,
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
        // Statics that keep state are found by their type (`syntax::KEEPS_STATE`). Atomics and
        // once-cells count anywhere they are added, as the line needles did: a field of the
        // engine's own structures keeps state across calls as a static does.
        paths: &[
            "thread_local",
            "lazy_static",
            "once_cell",
            "LocalKey",
            "OnceLock",
            "OnceCell",
            "LazyLock",
            "AtomicPtr",
            "AtomicBool",
            "AtomicUsize",
            "AtomicIsize",
            "AtomicU64",
            "AtomicI64",
            "AtomicU32",
            "AtomicI32",
            "AtomicU16",
            "AtomicI16",
            "AtomicU8",
            "AtomicI8",
        ],
        macros: NONE,
        methods: NONE,
        idents: NONE,
        literals: NONE,
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
        // `extern` blocks, symbol attributes and macros calling a macro their caller names are
        // found by their syntax (`syntax`).
        paths: &[
            "std::net",
            "std::process",
            "std::env",
            "std::os",
            "libc",
            "rustix",
            "nix",
            "socket2",
            "mio",
            "reqwest",
            "libloading",
            "tokio::net",
            "tokio::process",
            "TcpStream",
            "UdpSocket",
            "TcpListener",
            "UnixStream",
            "Command::new",
            "asm",
            "global_asm",
            "naked_asm",
            "option_env",
            "concat_idents",
            "paste",
            "no_mangle",
            "export_name",
            "link_name",
            "link_section",
        ],
        macros: &["env"],
        methods: NONE,
        idents: NONE,
        literals: NONE,
        why: "reaches outside the engine (network, processes, environment)",
    },
    Rule {
        name: "verify_skip",
        needles: &["skip_verify", "accept_all", "trust_draft"],
        paths: NONE,
        macros: NONE,
        methods: NONE,
        idents: &["skip_verify", "accept_all", "trust_draft"],
        literals: NONE,
        why: "skips verify work",
    },
    Rule {
        name: "lm_head_pruning",
        needles: &["lm_head.truncate", "vocab_limit", "prune"],
        paths: NONE,
        macros: NONE,
        methods: &["lm_head.truncate"],
        idents: &["vocab_limit", "prune"],
        literals: NONE,
        why: "prunes lm_head rows",
    },
];

/// The category of a changed Rust file the parser cannot read.
pub const UNPARSEABLE: &str = "unparseable";

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

/// The built-in finding over the changed files `(path, base text, new text)`: `(rule name,
/// public detail)`. Rust files (`*.rs`) first, by their syntax tree: an unparseable one, else
/// the finding of the earliest rule of `RULES`; then the other files, by line needles. An error
/// is the runner's own trouble (the parser's thread would not start), never a finding.
pub fn builtin(
    files: &[(String, String, String)],
) -> anyhow::Result<Option<(&'static str, String)>> {
    let (rust, other): (Vec<_>, Vec<_>) = files.iter().cloned().partition(|f| f.0.ends_with(".rs"));
    Ok(syntax::review(rust)?.or_else(|| by_lines(&other)))
}

/// The first line needle of `RULES` in the lines `files` add (code, not after a `//`).
fn by_lines(files: &[(String, String, String)]) -> Option<(&'static str, String)> {
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
    use std::path::Path;

    use super::*;

    /// The rule (if any) of what `new` adds to `old` in a Rust file of the surface.
    fn one(old: &str, new: &str) -> Option<&'static str> {
        at("crates/cpu/src/ops.rs", old, new)
    }

    fn at(path: &str, old: &str, new: &str) -> Option<&'static str> {
        builtin(&[(path.into(), old.into(), new.into())])
            .unwrap()
            .map(|(r, _)| r)
    }

    /// `body` as the body of a function.
    fn code(body: &str) -> String {
        format!("fn f() {{\n{body}\n}}\n")
    }

    /// The rule of what `new` adds to an empty file.
    fn alone(new: &str) -> Option<&'static str> {
        one("", new)
    }

    #[test]
    fn the_rules_flag_added_code_only() {
        let base = code("    let t = std::time::Instant::now();");
        // Code the base already has is not a finding; moving it is not either.
        assert_eq!(one(&base, &base), None);
        assert_eq!(one(&base, &format!("// moved\n{base}")), None);
        assert_eq!(
            one(
                &base,
                &format!("{base}fn g() {{ let _ = Instant::now(); }}\n")
            ),
            Some("clock")
        );
        assert_eq!(
            alone(&code("let g = std::fs::read(\"goldens/x\");")),
            Some("reads_files")
        );
        assert_eq!(alone("static mut CACHE: u32 = 0;"), Some("output_cache"));
        assert_eq!(
            alone(&code("let s = std::net::TcpStream::connect(a);")),
            Some("escape")
        );
        // Comments are not code.
        assert_eq!(alone(&code("let x = 1; // no std::fs here")), None);
        // A plain arithmetic change passes.
        assert_eq!(
            one(
                &code("acc += a * b;"),
                &code("acc0 += a0 * b;\nacc1 += a1 * b;")
            ),
            None
        );
    }

    #[test]
    fn a_path_through_a_use_rename_is_judged_by_what_it_names() {
        let cases = [
            // The red team's: a group with a rename, then the alias.
            "use std::{fs as disk};\nfn f() { let _ = disk::read(\"/x\"); }",
            "use std::fs::{self as disk};\nfn f() { let _ = disk::read(\"/x\"); }",
            "fn f() { use std as s; let _ = s::fs::read(\"/x\"); }",
            "extern crate std as s;\nfn f() { let _ = s::fs::read(\"/x\"); }",
            "use std::fs::read as load;\nfn f() { let _ = load(\"/x\"); }",
            "use std::*;\nfn f() { let _ = fs::read(\"/x\"); }",
            "use std::fs::*;\nfn f() { let _ = read(\"/x\"); }",
            "use ::std::r#fs as d;\nfn f() { let _ = d::read(\"/x\"); }",
            "use core::include_bytes as embed;\nstatic B: &[u8] = embed!(\"/x\");",
        ];
        for c in cases {
            assert_eq!(alone(c), Some("reads_files"), "{c}");
        }
        // Through two aliases, and a `use` made inside a macro's input.
        let chained = "use std as s;\nuse s::{fs as d};\nfn f() { let _ = d::read(\"/x\"); }";
        assert_eq!(alone(chained), Some("reads_files"));
        let hidden_use = "macro_rules! id { ($($t:tt)*) => { $($t)* } }\n\
                          id! { use std::{fs as d}; }\nfn f() { let _ = d::read(\"/x\"); }";
        assert_eq!(alone(hidden_use), Some("reads_files"));
        // The finding names the file, the line, and the path as written and as resolved.
        let (rule, detail) = builtin(&[(
            "crates/cpu/src/ops.rs".into(),
            String::new(),
            "use std::{fs as disk};\n\nfn f() { let _ = disk::read(\"/x\"); }".into(),
        )])
        .unwrap()
        .unwrap();
        assert_eq!(rule, "reads_files");
        assert!(
            detail.starts_with("crates/cpu/src/ops.rs:1: added code reads files"),
            "{detail}"
        );
        assert!(detail.contains("std::fs"), "{detail}");
    }

    #[test]
    fn a_qualified_path_is_judged_by_its_type_and_trait() {
        let cases = [
            // The red team's: a qualified path through a renamed module.
            "use std::{process as sp};\nfn f() { let _ = <sp::Command>::new(\"sh\"); }",
            "fn f() { let _ = <std::process::Command as std::fmt::Debug>::fmt; }",
            "fn f(x: &u8) { let _ = <u8 as std::os::fd::AsRawFd>::as_raw_fd(x); }",
            "use std::process::Command as Job;\nfn f() { let _ = Job::new(\"sh\").spawn(); }",
            "fn f() { let _ = std::env::var(\"FASTDECODE_PRICE\"); }",
            "fn f() { unsafe { libc::kill(libc::getppid(), 19) }; }",
        ];
        for c in cases {
            assert_eq!(alone(c), Some("escape"), "{c}");
        }
    }

    #[test]
    fn a_foreign_declaration_or_a_symbol_attribute_is_an_escape() {
        let cases = [
            "extern \"C\" { fn socket(d: i32, t: i32, p: i32) -> i32; fn connect(); }",
            "extern { fn kill(pid: i32, sig: i32) -> i32; }",
            "extern \"C\" { static environ: *const *const u8; }",
            "#[link(name = \"c\")]\nextern \"C\" {}",
            "#[no_mangle]\npub extern \"C\" fn clock_gettime() -> i32 { 0 }",
            "#[unsafe(export_name = \"clock_gettime\")]\npub extern \"C\" fn now() -> i32 { 0 }",
            "#[cfg_attr(unix, link_section = \".init_array\")]\nstatic INIT: u8 = 0;",
        ];
        for c in cases {
            assert_eq!(alone(c), Some("escape"), "{c}");
        }
    }

    #[test]
    fn the_clock_is_found_under_core_time_and_its_own_names() {
        let cases = [
            "fn f() { std::thread::sleep(core::time::Duration::from_millis(1)); }",
            "use core::time as t;\nfn f() { let _ = t::Duration::ZERO; }",
            "use std::time::{Instant as Moment};\nfn f() { let _ = Moment::now(); }",
            "fn f() -> u64 { unsafe { core::arch::x86_64::_rdtsc() } }",
            "fn f(t: &Timer) -> bool { t.start.elapsed().as_secs() > 2 }",
            "fn f() { let _ = std::time::SystemTime::now(); }",
        ];
        for c in cases {
            assert_eq!(alone(c), Some("clock"), "{c}");
        }
    }

    #[test]
    fn a_static_that_keeps_state_across_calls_is_an_output_cache() {
        let cases = [
            // The red team's: a counter behind a `static Mutex`.
            "static CALLS: std::sync::Mutex<u64> = std::sync::Mutex::new(0);",
            "use std::sync::Mutex;\nstatic CALLS: Mutex<u64> = Mutex::new(0);",
            "static CALLS: AtomicUsize = AtomicUsize::new(0);",
            "static mut LAST: u32 = 0;",
            "static SEEN: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();",
            "static P: Ptr = Ptr(0 as *mut u32);\nstruct Ptr(*mut u32);",
            // Through the bundle's own types, and an alias.
            "struct Counter { n: std::cell::Cell<u64> }\nunsafe impl Sync for Counter {}\n\
             static C: Counter = Counter { n: std::cell::Cell::new(0) };",
            "type Memo = std::sync::RwLock<Vec<u32>>;\nstatic M: Memo = Memo::new(Vec::new());",
            "fn f() -> u64 { static N: std::sync::atomic::AtomicU64 = \
             std::sync::atomic::AtomicU64::new(0); N.load(std::sync::atomic::Ordering::Relaxed) }",
            "thread_local! { static SEEN: std::cell::RefCell<Vec<u32>> = Default::default(); }",
            // An atomic or a once-cell anywhere: a field of a backend lives across calls.
            "struct Backend { calls: std::sync::atomic::AtomicU8 }",
            "struct Backend { memo: std::sync::OnceLock<Vec<u32>> }",
        ];
        for c in cases {
            assert_eq!(alone(c), Some("output_cache"), "{c}");
        }
    }

    #[test]
    fn a_macro_that_assembles_a_forbidden_macro_is_flagged() {
        let include = "macro_rules! embed { ($how:ident, $p:expr) => { $how!($p) }; }\n\
                       static POOL: &[u8] = embed!(include_bytes, concat!(\"/pool\", \".json\"));";
        assert_eq!(alone(include), Some("reads_files"));
        let env = "macro_rules! ask { ($m:ident) => { $m!(\"SEED\") }; }\n\
                   fn f() -> bool { ask!(option_env).is_some() }";
        assert_eq!(alone(env), Some("escape"));
        let asm = "use std::arch::asm;\nmacro_rules! cpu { ($op:ident, $($t:tt)*) => { $op!($($t)*) }; }\n\
                   fn f() { unsafe { cpu!(asm, \"nop\") } }";
        assert_eq!(alone(asm), Some("escape"));
        // A macro that calls whatever its caller names is itself an escape.
        let through = "macro_rules! call { ($m:ident) => { $m!() }; }";
        assert_eq!(alone(through), Some("escape"));
        let repeated = "macro_rules! call { ($($m:tt)*) => { $($m)*!(\"X\") }; }";
        assert_eq!(alone(repeated), Some("escape"));
        // What a macro's input or body names counts as code does.
        let cases = [
            (
                "fn f() { println!(\"{:?}\", std::fs::read(\"/x\")); }",
                "reads_files",
            ),
            (
                "macro_rules! m { () => { include_str!(\"/x\") }; }",
                "reads_files",
            ),
            (
                "fn f() { let _ = vec![std::time::Instant::now(); 2]; }",
                "clock",
            ),
            (
                "macro_rules! m { () => { static mut X: u8 = 0; }; }",
                "output_cache",
            ),
            (
                "macro_rules! m { () => { extern \"C\" { fn kill(); } }; }",
                "escape",
            ),
            (
                "macro_rules! m { () => { #[no_mangle] fn now() {} }; }",
                "escape",
            ),
            ("fn f() { let _ = env!(\"HOME\"); }", "escape"),
            ("fn f() { unsafe { core::arch::asm!(\"nop\") } }", "escape"),
        ];
        for (c, rule) in cases {
            assert_eq!(alone(c), Some(rule), "{c}");
        }
    }

    #[test]
    fn names_that_only_resemble_a_rule_pass() {
        let cases = [
            "fn f(hidden_size: usize, golden_ratio: f32) -> f32 { hidden_size as f32 * golden_ratio }",
            "fn f(t0: u64) -> u64 { let time = t0 + 1; time * 2 }",
            "const TABLE: [f32; 4] = [0.5, -0.25, 1.0, -2.0];",
            "static NAMES: [&str; 3] = [\"q\", \"k\", \"v\"];",
            "static FLAGS: &[(&str, u32)] = &[(\"fast_exp\", 1)];",
            "// reads std::fs, include_bytes!, Instant, static mut, asm!, env!, goldens\nfn f() {}",
            "/// Reads no golden, no `std::fs`, no `Instant`; keeps no `static mut`.\nfn f() {}",
            "//! Module docs: `include_bytes!`, `asm!`, `libc::kill`.\nfn f() {}",
            "fn f(a: u8, b: u8) -> bool { matches!(a, 1 | 2) && a != b && !(a == b) }",
            "fn f() -> &'static str { concat!(\"a\", \"b\") }",
            "#[cfg(target_arch = \"x86_64\")]\nfn f() { use std::arch::x86_64::*; let _ = unsafe { _mm_setzero_ps() }; }",
            "#[derive(Debug, Clone)]\n#[inline]\nstruct S { x: u8 }",
            "#[path = \"simd.rs\"]\nmod simd;",
            "mod prelude { pub fn now() {} }\nfn f() { prelude::now(); }",
        ];
        for c in cases {
            assert_eq!(alone(c), None, "{c}");
        }
    }

    #[test]
    fn a_rust_file_the_parser_cannot_read_is_flagged() {
        let (rule, detail) = builtin(&[(
            "crates/cpu/src/ops.rs".into(),
            code("let x = 1;"),
            "fn f( {\n".into(),
        )])
        .unwrap()
        .unwrap();
        assert_eq!(rule, UNPARSEABLE);
        assert!(
            detail.starts_with("crates/cpu/src/ops.rs: the review cannot parse it"),
            "{detail}"
        );
        assert_eq!(alone("fn f() { let = ; }"), Some(UNPARSEABLE));
        // A module read from a file that is not the bundle's Rust is not reviewable either.
        assert_eq!(
            alone("#[path = \"/root/.cache/fastdecode/arena/hidden/pool.json\"]\nmod pool;"),
            Some("reads_files")
        );
        assert_eq!(
            alone("#[path = \"../../gate/src/lib.rs\"]\nmod gate;"),
            Some("reads_files")
        );
    }

    #[test]
    fn code_nested_past_the_parsers_bound_is_unparseable_not_a_crash() {
        // Each recurses in syn once a repetition: at the bound it is parsed on the review's
        // stack (the generics then fail for want of their `>`), past it refused unparsed.
        // What repeats, how many tokens a repetition is, and a file of `n` repetitions.
        type Shape = (&'static str, usize, fn(usize) -> String);
        let shapes: [Shape; 9] = [
            ("!", 1, |n| {
                format!("fn f() {{ let _ = {}x; }}", "!".repeat(n))
            }),
            ("closure", 3, |n| {
                format!("fn f() {{ let _ = {}x; }}", "|x| ".repeat(n))
            }),
            ("closure list", 4, |n| {
                format!("fn f() {{ let _ = {}x; }}", "|x,| ".repeat(n))
            }),
            ("assign", 2, |n| {
                format!("fn f() {{ {}x; }}", "a = ".repeat(n))
            }),
            ("fn type", 4, |n| {
                format!("type T = {}u8;", "fn() -> ".repeat(n))
            }),
            ("impl fn", 5, |n| {
                format!("fn f() -> {}u8 {{}}", "impl Fn() -> ".repeat(n))
            }),
            ("else if", 4, |n| {
                format!("fn f() {{ if a {{}}{} }}", " else if a {}".repeat(n))
            }),
            ("generic", 2, |n| format!("type T = {}u8;", "V<".repeat(n))),
            ("generic list", 4, |n| {
                format!("type T = {}u8;", "V<u8, ".repeat(n))
            }),
        ];
        for (what, tokens, make) in shapes {
            let within = alone(&make((shape::MAX_CHAIN - 20) / tokens));
            let expected = if what.starts_with("generic") {
                Some(UNPARSEABLE)
            } else {
                None
            };
            assert_eq!(within, expected, "{what} within the bound");
            let past = make(3 * shape::MAX_CHAIN / tokens);
            assert_eq!(alone(&past), Some(UNPARSEABLE), "{what} past the bound");
        }
        let parens = |n| format!("fn f() {{ let _ = {}x{}; }}", "(".repeat(n), ")".repeat(n));
        assert_eq!(alone(&parens(shape::MAX_DEPTH - 4)), None);
        assert_eq!(alone(&parens(5000)), Some(UNPARSEABLE));
        let attributes = |n| format!("{}fn f() {{}}", "#[a(".repeat(n) + &")]".repeat(n));
        assert_eq!(alone(&attributes(shape::MAX_DEPTH / 2 - 2)), None);
        assert_eq!(alone(&attributes(5000)), Some(UNPARSEABLE));
        let blocks = |n| format!("fn f() {{ {}x{} }}", "unsafe { ".repeat(n), " }".repeat(n));
        assert_eq!(alone(&blocks(shape::MAX_DEPTH - 4)), None);
        assert_eq!(alone(&blocks(5000)), Some(UNPARSEABLE));
    }

    #[test]
    fn what_the_base_has_is_not_flagged_but_one_more_is() {
        let base =
            "use std::fs;\n\npub fn load(p: &str) -> Vec<u8> {\n    fs::read(p).unwrap()\n}\n";
        // The engine's own loading, moved, reformatted or renamed through an alias, is the same.
        assert_eq!(
            one(
                base,
                &format!("{base}\npub fn add(a: u8, b: u8) -> u8 {{ a + b }}\n")
            ),
            None
        );
        let moved = "pub fn add(a: u8) -> u8 { a }\nuse std::fs as fs;\n\
                     pub fn load(p: &str) -> Vec<u8> { fs::read(p).expect(\"the model\") }\n";
        assert_eq!(one(base, moved), None);
        // An alias or a glob the base has does not hide a new use through it.
        let imports = "use std::{process as sp};\nuse std::*;\n";
        let spawn = format!("{imports}fn f() {{ let _ = <sp::Command>::new(\"sh\"); }}\n");
        assert_eq!(one(imports, &spawn), Some("escape"));
        let read = format!("{imports}fn f() {{ let _ = fs::read(\"/x\"); }}\n");
        assert_eq!(one(imports, &read), Some("reads_files"));
        // A second read is one more than the base has.
        let again = format!("{base}\npub fn peek() -> Vec<u8> {{ fs::read(\"/x\").unwrap() }}\n");
        assert_eq!(one(base, &again), Some("reads_files"));
        // A base file the parser cannot read counts as having nothing.
        assert_eq!(
            one("fn (", &code("let _ = std::fs::read(\"/x\");")),
            Some("reads_files")
        );
    }

    #[test]
    fn other_files_keep_the_line_needles() {
        let cu = "crates/cuda/kernels/attention.cu";
        // Inline PTX is ordinary in a kernel.
        let ptx = "asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t));\n";
        assert_eq!(at(cu, "", ptx), None);
        assert_eq!(at(cu, "", "// hidden in a comment\nint x = 0;\n"), None);
        assert_eq!(at(cu, "", "int hidden = 0;\n"), Some("reads_files"));
        assert_eq!(at(cu, "int hidden = 0;\n", "int hidden = 0;\n"), None);
        assert_eq!(
            at("crates/cuda/Cargo.toml", "", "libc::x = 1\n"),
            Some("escape")
        );
        // Not Rust, so not parsed: no finding for text that is not Rust.
        assert_eq!(at("crates/cpu/src/notes.md", "", "fn ( {\n"), None);
    }

    /// The repository root, and the files of `case`'s bundle as `(path, base, new)` against its
    /// track's pinned baseline.
    fn bundle(case: &crate::client::redteam::Case) -> Vec<(String, String, String)> {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let tracks = crate::track::load_dir(&repo.join("tracks")).unwrap();
        let base = &tracks[&case.track].baseline;
        let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
        case.entries(&repo, base)
            .unwrap()
            .into_iter()
            .map(|(p, c)| {
                let crate::bundle::Content::File(data, _) = c else {
                    panic!("{p}: a file");
                };
                let old = crate::git::contents(&repo, base, &p).unwrap().map(text);
                (p, old.unwrap_or_default(), text(data))
            })
            .collect()
    }

    #[test]
    fn every_review_case_of_the_corpus_is_stopped_by_its_category_and_the_controls_pass() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../redteam");
        let cases = crate::client::redteam::load(&dir).unwrap();
        let mut reviewed = 0;
        for (name, c) in cases
            .iter()
            .filter(|(_, c)| c.stage == "review" || c.control())
        {
            let found = builtin(&bundle(c)).unwrap();
            let category = found.as_ref().map(|(r, _)| format!("review:{r}"));
            if c.control() {
                assert_eq!(found, None, "{name}: a control");
            } else {
                assert_eq!(
                    category.as_deref(),
                    Some(c.category.as_str()),
                    "{name}: {found:?}"
                );
            }
            reviewed += 1;
        }
        assert!(reviewed >= 23, "{reviewed} cases");
    }

    #[test]
    fn the_examples_patches_pass_review() {
        // The exact speed-ups (the controls) and the wrong tokens (which the gate, not the
        // review, must stop) change only ordinary code, on the CPU path and on the CUDA path.
        for patch in [
            "speedup.patch",
            "wrong-token.patch",
            "speedup-cuda.patch",
            "wrong-token-cuda.patch",
        ] {
            let case = crate::client::redteam::Case::parse(
                &format!(
                    "description = \"d\"\ntrack = \"serial-tiny\"\nstage = \"verdict\"\n\
                     category = \"passed\"\npatch = \"tracks/examples/{patch}\"\n"
                ),
                Path::new("x.toml"),
            )
            .unwrap();
            let files = bundle(&case);
            assert!(
                !files.is_empty() && files.iter().all(|f| f.1 != f.2),
                "{patch}"
            );
            assert_eq!(builtin(&files).unwrap(), None, "{patch}");
        }
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
