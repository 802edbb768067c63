//! The sandbox of the candidate's build and worker processes: bubblewrap (`bwrap`, Debian's
//! `bubblewrap`). Inside: no network (a network namespace of its own), its own PID namespace
//! (the runner cannot be signalled or traced), a read-only system (`/usr`, `/etc`, and the Rust
//! toolchain for builds), an empty private `/tmp`, and of everything else only what the stage
//! binds: the build directory (writable) for a build, the candidate binary and the model
//! (read-only) for a worker. The runner's cache (hidden goldens, other builds), the service's
//! files and every home directory stay out of view.
//!
//! A runner probes the sandbox when it starts (`probe`): each forbidden thing is tried inside
//! it, and if any succeeds the runner refuses to serve.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

pub struct Sandbox {
    bwrap: PathBuf,
    /// GPU runners pass the host's devices through (the driver's nodes under /dev).
    devices: bool,
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    })
}

/// The Rust toolchain's homes (read-only inside a build sandbox).
fn toolchain() -> Vec<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let cargo = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| home.as_ref().map(|h| h.join(".cargo")));
    let rustup = std::env::var_os("RUSTUP_HOME")
        .map(PathBuf::from)
        .or_else(|| home.as_ref().map(|h| h.join(".rustup")));
    [cargo, rustup]
        .into_iter()
        .flatten()
        .filter(|p| p.is_dir())
        .collect()
}

fn quote(s: &std::ffi::OsStr) -> String {
    format!("'{}'", s.to_string_lossy().replace('\'', r"'\''"))
}

impl Sandbox {
    /// bubblewrap on `PATH`, or why not.
    pub fn find(kind: &str) -> Result<Sandbox> {
        let bwrap = on_path("bwrap").context(
            "bwrap (bubblewrap) is not installed: the runner runs candidates only inside its \
             sandbox (Debian: apt-get install bubblewrap)",
        )?;
        Ok(Sandbox {
            bwrap,
            devices: kind == "cuda",
        })
    }

    /// The namespace and filesystem options every sandbox has, then `ro` bound read-only and
    /// `rw` bound writable, each at its own path.
    fn args(&self, ro: &[&Path], rw: &[&Path]) -> Vec<OsString> {
        let mut a: Vec<OsString> = [
            "--die-with-parent",
            "--unshare-all",
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
            "--ro-bind",
            "/etc",
            "/etc",
            "--proc",
            "/proc",
            "--tmpfs",
            "/tmp",
        ]
        .map(OsString::from)
        .to_vec();
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
        for p in ro {
            a.extend([
                "--ro-bind".into(),
                p.as_os_str().into(),
                p.as_os_str().into(),
            ]);
        }
        for p in rw {
            a.extend(["--bind".into(), p.as_os_str().into(), p.as_os_str().into()]);
        }
        a
    }

    /// `program args` inside a sandbox that sees `ro` and can write `rw`.
    pub fn command(&self, ro: &[&Path], rw: &[&Path], program: &Path) -> Command {
        let mut c = Command::new(&self.bwrap);
        c.args(self.args(ro, rw)).arg("--").arg(program);
        c
    }

    /// The build: cargo with the toolchain read-only (its lock files writable: cargo takes them
    /// even offline), `dirs` writable, the environment cleared but for `env`.
    pub fn cargo(&self, dirs: &[&Path], env: &[(&str, &Path)]) -> Result<Command> {
        let cargo = on_path("cargo").context("cargo is not on PATH")?;
        let tools = toolchain();
        let mut ro: Vec<&Path> = tools.iter().map(PathBuf::as_path).collect();
        let locks: Vec<PathBuf> = tools
            .iter()
            .flat_map(|t| {
                [".package-cache", ".package-cache-mutate", ".global-cache"].map(|f| t.join(f))
            })
            .filter(|f| f.is_file())
            .collect();
        let mut rw: Vec<&Path> = dirs.to_vec();
        rw.extend(locks.iter().map(PathBuf::as_path));
        if let Some(bin) = cargo
            .parent()
            .filter(|b| !tools.iter().any(|t| b.starts_with(t)))
        {
            ro.push(bin);
        }
        let mut c = Command::new(&self.bwrap);
        c.args(self.args(&ro, &rw));
        for (k, v) in env {
            c.arg("--setenv").arg(k).arg(v);
        }
        if let Some(t) = tools.first() {
            c.arg("--setenv").arg("CARGO_HOME").arg(t);
        }
        if let Some(r) = tools.iter().find(|t| t.ends_with(".rustup")) {
            c.arg("--setenv").arg("RUSTUP_HOME").arg(r);
        }
        if let Some(d) = dirs.first() {
            c.arg("--chdir").arg(d);
        }
        c.arg("--").arg(cargo);
        Ok(c)
    }

    /// A script at `at` that runs `candidate` with its arguments inside a sandbox seeing only
    /// `ro` besides the system: what `gate` and `price` start as the candidate's workers.
    pub fn wrapper(&self, candidate: &Path, ro: &[&Path], at: &Path) -> Result<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        let mut all = ro.to_vec();
        all.push(candidate);
        let mut line = quote(self.bwrap.as_os_str());
        for a in self.args(&all, &[]) {
            line += " ";
            line += &quote(&a);
        }
        line += &format!(" -- {} \"$@\"", quote(candidate.as_os_str()));
        let script = format!(
            "#!/bin/sh\n# The candidate, sandboxed (fastdecode arena runner).\nexec {line}\n"
        );
        crate::store::write_atomic(at, script.as_bytes())?;
        std::fs::set_permissions(at, std::fs::Permissions::from_mode(0o755))?;
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
            println!("{a} {}", if worked { "worked" } else { "refused" });
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
            "sandbox::tests::probe_child",
            "--nocapture",
        ];
        let mut c = if inside {
            let mut c = Command::new(&real.bwrap);
            c.args(real.args(&[exe.as_path()], &[]))
                .arg("--ro-bind")
                .arg(&file)
                .arg(PROBE_AT)
                .arg("--")
                .arg(&exe);
            c
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
