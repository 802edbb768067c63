//! The sandbox of the candidate's build and worker processes: bubblewrap (`bwrap`, Debian's
//! `bubblewrap`). Inside: no network (a network namespace of its own), its own PID namespace
//! (the runner cannot be signalled or traced), `/usr` read-only and of `/etc` only the dynamic
//! linker's cache and `alternatives` (the links that resolve `/usr/bin/cc` or
//! `/usr/local/cuda`), an empty private `/tmp`,
//! and of everything else only what the stage mounts (`Mount`): a build's private directories,
//! or the candidate binary, the model and the build's compiled kernels, read-only. The runner's
//! cache (hidden goldens, other builds), the service's files and every home directory stay out
//! of view.
//!
//! The candidate runs as an unprivileged user. A runner started by root runs it as `nobody`
//! (uid 65534, no capabilities, through `setpriv`), in namespaces without a user namespace,
//! since one would map the sandbox's user to the host's root, whose files it could then read;
//! what it must write is handed to that user first (`Sandbox::give`). A runner started by
//! another user runs it as that user, mapped by a user namespace.
//!
//! A runner probes the sandbox when it starts (`probe`): each forbidden thing is tried inside
//! it, and if any succeeds the runner refuses to serve.

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

pub struct Sandbox {
    bwrap: PathBuf,
    /// GPU runners pass the host's devices through (the driver's nodes under /dev).
    devices: bool,
    /// The host user the candidate runs as when the runner is root (`None`: the runner's own
    /// user, through a user namespace).
    drop_to: Option<u32>,
}

/// A path of the host seen inside the sandbox at `dest`, writable or not.
#[derive(Debug, Clone)]
pub struct Mount {
    pub src: PathBuf,
    pub dest: PathBuf,
    pub write: bool,
}

impl Mount {
    /// `src` read-only at `dest`.
    pub fn ro(src: impl Into<PathBuf>, dest: impl Into<PathBuf>) -> Mount {
        Mount {
            src: src.into(),
            dest: dest.into(),
            write: false,
        }
    }
    /// `src` writable at `dest`.
    pub fn rw(src: impl Into<PathBuf>, dest: impl Into<PathBuf>) -> Mount {
        Mount {
            write: true,
            ..Mount::ro(src, dest)
        }
    }
    /// `p` read-only at its own path.
    pub fn same(p: &Path) -> Mount {
        Mount::ro(p, p)
    }
}

/// The unprivileged user a root runner's candidates run as.
pub const NOBODY: u32 = 65534;

/// Variables a wrapper passes from its caller (the trusted clock or gate) to the candidate.
const PASSED_TO_WORKERS: [&str; 1] = ["FASTDECODE_WORKER_DRAFTER"];

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    })
}

/// The Rust toolchain a build runs: the host's sysroot (`rustc --print sysroot`; behind a
/// rustup proxy, the toolchain it picks), whose `bin/` holds cargo and rustc. It is mounted at
/// `/toolchain` (rustc finds its libraries relative to itself).
fn sysroot() -> Result<PathBuf> {
    let o = Command::new("rustc")
        .args(["--print", "sysroot"])
        .stderr(Stdio::null())
        .output()
        .context("running rustc --print sysroot (is Rust installed?)")?;
    let p = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
    if !o.status.success() || !p.join("bin/cargo").is_file() {
        bail!(
            "rustc --print sysroot: {} has no bin/cargo (a toolchain with cargo is needed)",
            p.display()
        );
    }
    Ok(p)
}

fn quote(s: &OsStr) -> String {
    format!("'{}'", s.to_string_lossy().replace('\'', r"'\''"))
}

/// Where a build's directories are inside its sandbox: the same paths for every build, so a
/// build seeded with another's target directory (`builder`) rebuilds only what changed.
pub mod build_paths {
    pub const SRC: &str = "/build/src";
    pub const TARGET: &str = "/build/target";
    pub const CARGO_HOME: &str = "/build/cargo-home";
    pub const REGISTRY: &str = "/build/cargo-home/registry";
    pub const TOOLCHAIN: &str = "/toolchain";
}

/// The directories one build writes and reads.
pub struct BuildMounts<'a> {
    pub src: &'a Path,
    pub target: &'a Path,
    pub cargo_home: &'a Path,
    /// The crates' sources, readable by the sandbox's user (`builder::registry`).
    pub registry: &'a Path,
}

impl Sandbox {
    /// bubblewrap on `PATH`, or why not.
    pub fn find(kind: &str) -> Result<Sandbox> {
        let bwrap = on_path("bwrap").context(
            "bwrap (bubblewrap) is not installed: the runner runs candidates only inside its \
             sandbox (Debian: apt-get install bubblewrap)",
        )?;
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        Ok(Sandbox {
            bwrap,
            devices: kind == "cuda",
            drop_to: root.then_some(NOBODY),
        })
    }

    /// The user the candidate runs as, when the runner hands it what it must write.
    pub fn drops_to(&self) -> Option<u32> {
        self.drop_to
    }

    /// Hands `dir` (and everything under it) to the sandbox's user, so it can write there.
    pub fn give(&self, dir: &Path) -> Result<()> {
        let Some(uid) = self.drop_to else {
            return Ok(());
        };
        let st = Command::new("chown")
            .args(["-R", &format!("{uid}:{uid}")])
            .arg(dir)
            .status()
            .context("running chown")?;
        if !st.success() {
            bail!("chown -R {uid} {}: {st}", dir.display());
        }
        Ok(())
    }

    /// The namespaces, the system and `mounts`; `env` set in the cleared environment.
    fn args(&self, mounts: &[Mount], env: &[(&str, &OsStr)]) -> Vec<OsString> {
        let namespaces: &[&str] = if self.drop_to.is_some() {
            &[
                "--unshare-ipc",
                "--unshare-pid",
                "--unshare-net",
                "--unshare-uts",
                "--unshare-cgroup-try",
            ]
        } else {
            &["--unshare-all"]
        };
        let mut a: Vec<OsString> = namespaces.iter().map(OsString::from).collect();
        a.extend(
            [
                "--die-with-parent",
                "--new-session",
                "--clearenv",
                "--setenv",
                "PATH",
                "/usr/local/bin:/usr/bin:/bin",
                "--setenv",
                "HOME",
                "/tmp",
                "--ro-bind",
                "/usr",
                "/usr",
                "--proc",
                "/proc",
                "--perms",
                "1777",
                "--tmpfs",
                "/tmp",
            ]
            .map(OsString::from),
        );
        if self.devices {
            // Where the GPU machine keeps its driver and CUDA libraries (an operator's paths,
            // which the cleared environment would lose): the candidate needs them to use it.
            for var in ["LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH"] {
                if let Some(v) = std::env::var_os(var) {
                    a.extend(["--setenv".into(), var.into(), v]);
                }
            }
        }
        for (k, v) in env {
            a.extend(["--setenv".into(), OsString::from(k), v.into()]);
        }
        // Merged-/usr systems link /bin, /lib, ... into /usr; others have them as directories.
        for top in ["bin", "sbin", "lib", "lib32", "lib64"] {
            let p = Path::new("/").join(top);
            match std::fs::read_link(&p) {
                Ok(t) => a.extend(["--symlink".into(), t.into_os_string(), p.into_os_string()]),
                Err(_) if p.is_dir() => a.extend(["--ro-bind".into(), p.clone().into(), p.into()]),
                Err(_) => {}
            }
        }
        if self.devices {
            a.extend(["--dev-bind", "/dev", "/dev"].map(OsString::from));
        } else {
            a.extend(["--dev", "/dev"].map(OsString::from));
        }
        let mut all = vec![];
        // The dynamic linker's cache, and Debian's alternatives: links by which paths under /usr
        // resolve (/usr/bin/cc for a build, /usr/local/cuda on a GPU machine).
        for etc in ["/etc/ld.so.cache", "/etc/alternatives"] {
            if Path::new(etc).exists() {
                all.push(Mount::same(Path::new(etc)));
            }
        }
        all.extend(mounts.iter().cloned());
        a.extend(mount_args(&all));
        a
    }

    /// `program` (with `setpriv` in front when the runner is root) as the command's tail.
    fn exec(&self, c: &mut Command, program: &Path) {
        c.arg("--");
        if let Some(uid) = self.drop_to {
            c.args(setpriv(uid));
            c.arg("--");
        }
        c.arg(program);
    }

    /// `program args` inside a sandbox that sees `mounts`.
    pub fn command(&self, mounts: &[Mount], env: &[(&str, &OsStr)], program: &Path) -> Command {
        let mut c = Command::new(&self.bwrap);
        c.args(self.args(mounts, env));
        self.exec(&mut c, program);
        c
    }

    /// The build: the toolchain's cargo, the build's directories at `build_paths` (its sources,
    /// target and cargo home writable, the crates' sources read-only), offline.
    pub fn cargo(&self, b: &BuildMounts) -> Result<Command> {
        use build_paths::*;
        let mut mounts = vec![Mount::ro(sysroot()?, TOOLCHAIN)];
        mounts.extend(build_mounts(b));
        let path = format!("{TOOLCHAIN}/bin:/usr/local/bin:/usr/bin:/bin");
        let env: [(&str, &OsStr); 4] = [
            ("PATH", path.as_ref()),
            ("CARGO_HOME", CARGO_HOME.as_ref()),
            ("CARGO_TARGET_DIR", TARGET.as_ref()),
            ("CARGO_NET_OFFLINE", "true".as_ref()),
        ];
        let mut c = Command::new(&self.bwrap);
        c.args(self.args(&mounts, &env)).args(["--chdir", SRC]);
        self.exec(&mut c, &Path::new(TOOLCHAIN).join("bin/cargo"));
        Ok(c)
    }

    /// A script at `at` that runs `candidate` (mounted at its own path) with its arguments
    /// inside a sandbox seeing `mounts` besides the system: what `gate` and `price` start as
    /// the candidate's workers.
    pub fn wrapper(
        &self,
        candidate: &Path,
        mounts: &[Mount],
        env: &[(&str, &OsStr)],
        at: &Path,
    ) -> Result<PathBuf> {
        let mut all = mounts.to_vec();
        all.push(Mount::same(candidate));
        let mut line = quote(self.bwrap.as_os_str());
        for a in self.args(&all, env) {
            line += " ";
            line += &quote(&a);
        }
        // What the parent tells a worker through its environment (the worker protocol's
        // `FASTDECODE_WORKER_DRAFTER`: load no drafter), passed on from the wrapper's caller;
        // nothing else of the caller's environment reaches the candidate.
        for var in PASSED_TO_WORKERS {
            line += &format!(" --setenv {var} \"${{{var}:-}}\"");
        }
        line += " --";
        if let Some(uid) = self.drop_to {
            for a in setpriv(uid) {
                line += &format!(" {}", quote(OsStr::new(&a)));
            }
            line += " --";
        }
        line += &format!(" {} \"$@\"", quote(candidate.as_os_str()));
        let script = format!(
            "#!/bin/sh\n# The candidate, sandboxed (fastdecode arena runner).\nexec {line}\n"
        );
        crate::store::write_atomic_mode(at, script.as_bytes(), 0o755)?;
        Ok(at.to_path_buf())
    }

    /// Tries each forbidden thing inside the sandbox; an error names the first that worked.
    /// `secret` is a file the sandbox must not read (it is created for the probe), `server` the
    /// service's `host:port` it must not reach.
    pub fn probe(&self, secret: &Path, server: &str) -> Result<()> {
        crate::store::write_atomic(secret, b"the sandbox must not read this\n")?;
        let me = std::process::id();
        let tries = [
            (
                "reach the service",
                format!("exec 3<>/dev/tcp/{}", server.replace(':', "/")),
            ),
            (
                "read the runner's cache",
                format!("cat {}", quote(secret.as_os_str())),
            ),
            (
                "write to the system",
                "touch /usr/.fastdecode-sandbox-probe".to_string(),
            ),
            ("signal the runner", format!("kill -0 {me}")),
            (
                "see the runner's processes",
                format!("test -e /proc/{me}/status"),
            ),
            (
                "run as root (of the host, or mapped to it)",
                // The host's uid of this process: its uid mapped through its namespace's map.
                r#"u=$(id -u); while read a b n; do [ "$u" -ge "$a" ] && [ "$u" -lt $((a + n)) ] && [ $((b + u - a)) -eq 0 ] && exit 0; done < /proc/self/uid_map; exit 1"#.to_string(),
            ),
        ];
        // The harness itself must work: a sandbox that cannot even run `true` proves nothing.
        let st = self
            .command(&[], &[], Path::new("/bin/sh"))
            .args(["-c", "true"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .context("running bwrap")?;
        if !st.success() {
            bail!(
                "the sandbox does not start ({} -- /bin/sh -c true: {st})",
                self.bwrap.display()
            );
        }
        for (what, script) in tries {
            let st = self
                .command(&[], &[], Path::new("/bin/bash"))
                .args(["-c", &script])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .context("running bwrap")?;
            if st.success() {
                bail!("the sandbox let a candidate {what} ({script}): refusing to serve");
            }
        }
        Ok(())
    }
}

/// What one build sees of its own directories: nothing of any other build's.
pub fn build_mounts(b: &BuildMounts) -> Vec<Mount> {
    use build_paths::*;
    vec![
        Mount::rw(b.src, SRC),
        Mount::rw(b.target, TARGET),
        Mount::rw(b.cargo_home, CARGO_HOME),
        Mount::ro(b.registry, REGISTRY),
    ]
}

/// `setpriv` switching to `uid` with no capabilities left, before the candidate starts.
fn setpriv(uid: u32) -> Vec<String> {
    vec![
        "/usr/bin/setpriv".into(),
        format!("--reuid={uid}"),
        format!("--regid={uid}"),
        "--clear-groups".into(),
        "--inh-caps=-all".into(),
        "--bounding-set=-all".into(),
    ]
}

/// bwrap's options for `mounts`: each destination's missing parents made first as directories
/// anyone may enter (bwrap's own are private to root, which the unprivileged user could not
/// pass), then the binds in order.
fn mount_args(mounts: &[Mount]) -> Vec<OsString> {
    let mut made: BTreeSet<PathBuf> = ["/", "/usr", "/tmp", "/proc", "/dev"]
        .map(PathBuf::from)
        .into();
    let mut a = vec![];
    for m in mounts {
        let parents: Vec<&Path> = m.dest.ancestors().skip(1).collect();
        for dir in parents.into_iter().rev() {
            if made.insert(dir.to_path_buf()) {
                a.extend(["--perms".into(), "0755".into(), "--dir".into(), dir.into()]);
            }
        }
        made.insert(m.dest.clone());
        let how = if m.write { "--bind" } else { "--ro-bind" };
        a.extend([how.into(), m.src.clone().into(), m.dest.clone().into()]);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_quotes() {
        assert_eq!(quote(std::ffi::OsStr::new("a'b")), r"'a'\''b'");
    }

    /// An executable script at `path`, written by a child process: this multi-threaded test
    /// process never holds it open for writing, so no sibling's fork can keep it busy (ETXTBSY)
    /// when it is run.
    fn script(path: &Path, text: &str) {
        let st = Command::new("sh")
            .args([
                "-c",
                r#"printf '%s' "$1" > "$2" && chmod 755 "$2""#,
                "sh",
                text,
            ])
            .arg(path)
            .status()
            .unwrap();
        assert!(st.success());
    }

    /// A sandbox whose `bwrap` is `wrapper`, a script standing in for a misconfigured one.
    fn leaky(dir: &Path, name: &str, body: &str) -> Sandbox {
        let at = dir.join(name);
        script(&at, &format!("#!/bin/bash\n{body}\n"));
        Sandbox {
            bwrap: at,
            devices: false,
            drop_to: None,
        }
    }

    /// What a sandboxed child is told: where the parent listens, its pid, a file of its cache,
    /// a directory outside the child's workspace.
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Probe {
        server: String,
        parent: i32,
        secret: PathBuf,
        outside: PathBuf,
        /// Which of `ACTIONS` to try.
        actions: Vec<String>,
    }

    /// Where a child reads its `Probe` (bound read-only at this path inside the sandbox).
    const PROBE_AT: &str = "/fastdecode-probe.json";

    /// Each forbidden action, done by this test binary: `true` when it worked.
    fn forbidden(action: &str, p: &Probe) -> bool {
        use std::io::Read;
        match action {
            "connect" => std::net::TcpStream::connect(&p.server).is_ok(),
            "read_hidden" => std::fs::read(&p.secret).is_ok(),
            "write_outside" => {
                std::fs::write(p.outside.join("left-by-the-candidate"), b"x").is_ok()
            }
            "write_system" => std::fs::write("/usr/fastdecode-probe", b"x").is_ok(),
            // Signal 0: the permission and existence checks of kill(2), nothing delivered.
            "kill_parent" => unsafe { libc::kill(p.parent, 0) == 0 },
            "ptrace_parent" => {
                let r = unsafe {
                    libc::ptrace(
                        libc::PTRACE_ATTACH,
                        p.parent,
                        std::ptr::null_mut::<libc::c_void>(),
                        std::ptr::null_mut::<libc::c_void>(),
                    )
                };
                if r == 0 {
                    unsafe {
                        libc::ptrace(
                            libc::PTRACE_DETACH,
                            p.parent,
                            std::ptr::null_mut::<libc::c_void>(),
                            std::ptr::null_mut::<libc::c_void>(),
                        )
                    };
                }
                r == 0
            }
            // A byte of the parent's memory at an address its maps say is readable.
            "read_parent_mem" => (|| {
                let maps = std::fs::read_to_string(format!("/proc/{}/maps", p.parent)).ok()?;
                let start = maps
                    .lines()
                    .find(|l| {
                        l.split_whitespace()
                            .nth(1)
                            .is_some_and(|m| m.starts_with('r'))
                    })
                    .and_then(|l| l.split('-').next())
                    .and_then(|a| u64::from_str_radix(a, 16).ok())?;
                let mut f = std::fs::File::open(format!("/proc/{}/mem", p.parent)).ok()?;
                use std::io::Seek;
                f.seek(std::io::SeekFrom::Start(start)).ok()?;
                let mut b = [0u8; 1];
                f.read_exact(&mut b).ok()
            })()
            .is_some(),
            a => panic!("no action {a}"),
        }
    }

    const ACTIONS: [&str; 7] = [
        "connect",
        "read_hidden",
        "write_outside",
        "write_system",
        "kill_parent",
        "ptrace_parent",
        "read_parent_mem",
    ];

    /// Not a test on its own (ignored): the child the probes run, inside the sandbox or not.
    /// Prints `ACTION worked` or `ACTION refused` for each action.
    #[test]
    #[ignore]
    fn probe_child() {
        let at = std::env::var_os("FASTDECODE_PROBE").unwrap_or_else(|| PROBE_AT.into());
        let text = std::fs::read(&at).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; this child is run by each_forbidden_action_fails_inside_the_sandbox, \
                 not on its own",
                at.to_string_lossy()
            )
        });
        let p: Probe = serde_json::from_slice(&text).unwrap();
        for a in &p.actions {
            let worked = forbidden(a, &p);
            #[allow(clippy::print_stdout)] // the probe's parent reads its findings from stdout
            {
                println!("{a} {}", if worked { "worked" } else { "refused" });
            }
        }
    }

    /// What each action did in a child: `inside` the real sandbox, or on the host.
    fn run_child(real: &Sandbox, p: &Probe, dir: &Path, inside: bool) -> Vec<(String, bool)> {
        let file = dir.join("probe.json");
        std::fs::write(&file, serde_json::to_vec(p).unwrap()).unwrap();
        let exe = std::env::current_exe().unwrap();
        let filter = [
            "--ignored",
            "--exact",
            "runner::sandbox::tests::probe_child",
            "--nocapture",
        ];
        let mut c = if inside {
            let mounts = [Mount::same(&exe), Mount::ro(&file, PROBE_AT)];
            real.command(&mounts, &[], &exe)
        } else {
            let mut c = Command::new(&exe);
            c.env("FASTDECODE_PROBE", &file);
            c
        };
        let o = c.args(filter).stdin(Stdio::null()).output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "the probe's child: {out}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let got: Vec<(String, bool)> = out
            .lines()
            .filter_map(|l| {
                let (a, r) = l.split_once(' ')?;
                ACTIONS.contains(&a).then(|| (a.to_string(), r == "worked"))
            })
            .collect();
        assert_eq!(got.len(), p.actions.len(), "{out}");
        got
    }

    /// From inside the candidate's sandbox each forbidden action fails: a network connection
    /// to a service listening on the host, reading a file of the runner's cache, writing outside
    /// the workspace or to the system, signalling or tracing the parent, reading its memory. On
    /// the host the same child connects, reads the file, writes outside and signals the parent,
    /// so those probes can see a leak (it does not write to the system, trace this process or
    /// read its memory there: a host's ptrace policy decides those, and a trace would stop it).
    #[test]
    fn each_forbidden_action_fails_inside_the_sandbox() {
        let real = Sandbox::find("cpu").expect("bubblewrap is installed (tools/test.sh)");
        let service = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let outside = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let secret = cache.path().join("hidden-golden");
        std::fs::write(&secret, b"hidden").unwrap();
        let mut p = Probe {
            server: service.local_addr().unwrap().to_string(),
            parent: std::process::id() as i32,
            secret,
            outside: outside.path().to_path_buf(),
            actions: ACTIONS.map(String::from).to_vec(),
        };
        let inside = run_child(&real, &p, dir.path(), true);
        assert_eq!(inside.len(), ACTIONS.len());
        for (a, worked) in inside {
            assert!(!worked, "{a} worked inside the sandbox");
        }
        p.actions = ["connect", "read_hidden", "write_outside", "kill_parent"]
            .map(String::from)
            .to_vec();
        for (a, worked) in run_child(&real, &p, dir.path(), false) {
            assert!(
                worked,
                "{a} failed on the host too: the probe could not see a leak"
            );
        }
    }

    /// A wrapper passes the worker protocol's variables from its caller and no other.
    #[test]
    fn a_wrapper_passes_the_drafter_variable_and_nothing_else() {
        let real = Sandbox::find("cpu").expect("bubblewrap is installed (tools/test.sh)");
        let dir = tempfile::tempdir().unwrap();
        let env = Path::new("/usr/bin/env");
        let w = real.wrapper(env, &[], &[], &dir.path().join("w")).unwrap();
        let run = |drafter: Option<&str>| {
            let mut c = Command::new(&w);
            c.env("FASTDECODE_SECRET_OF_THE_PARENT", "x");
            if let Some(v) = drafter {
                c.env("FASTDECODE_WORKER_DRAFTER", v);
            }
            let out = c.output().unwrap();
            assert!(out.status.success(), "{out:?}");
            String::from_utf8(out.stdout).unwrap()
        };
        let told = run(Some("0"));
        assert!(
            told.lines().any(|l| l == "FASTDECODE_WORKER_DRAFTER=0"),
            "{told}"
        );
        assert!(!told.contains("FASTDECODE_SECRET_OF_THE_PARENT"), "{told}");
        let untold = run(None);
        assert!(
            untold.lines().any(|l| l == "FASTDECODE_WORKER_DRAFTER="),
            "{untold}"
        );
    }

    /// The runner's start-up probe passes the real sandbox and refuses each leaky one, naming
    /// what leaked: no sandbox at all, the host's network kept, the runner's cache bound in.
    /// A service listens on loopback throughout, so "reach the service" can really succeed.
    #[test]
    fn the_probe_passes_the_sandbox_and_refuses_a_leaky_one() {
        let real = Sandbox::find("cpu").expect("bubblewrap is installed (tools/test.sh)");
        let service = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server = service.local_addr().unwrap().to_string();
        let dir = tempfile::tempdir().unwrap();
        // Not under /tmp (the sandbox's /tmp is its own, which would hide it anyway): a runner's
        // cache is wherever its operator put it.
        let cache = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let secret = cache.path().join("hidden-golden");
        real.probe(&secret, &server)
            .expect("the real sandbox passes its probe");

        let bwrap = real.bwrap.display().to_string();
        // bwrap's options, then `--extra` before the command's `--`.
        let with = |extra: &str| {
            format!(
                "a=()\nwhile [ \"$1\" != -- ]; do a+=(\"$1\"); shift; done\nexec '{bwrap}' \"${{a[@]}}\" {extra} \"$@\""
            )
        };
        let cases = [
            (
                "none",
                "while [ \"$1\" != -- ]; do shift; done\nshift\nexec \"$@\"".to_string(),
                "reach the service",
            ),
            ("share-net", with("--share-net"), "reach the service"),
            (
                "cache-bound",
                with(&format!(
                    "--ro-bind {0} {0}",
                    quote(cache.path().as_os_str())
                )),
                "read the runner's cache",
            ),
        ];
        for (name, body, leak) in cases {
            let err = leaky(dir.path(), name, &body)
                .probe(&secret, &server)
                .expect_err(name);
            let msg = format!("{err:#}");
            assert!(
                msg.contains(leak) && msg.contains("refusing to serve"),
                "{name}: {msg}"
            );
        }
    }
}
