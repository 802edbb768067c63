//! A stage's child process as the runner runs it: its output to a log, in a process group of
//! its own that dies with the runner (`PR_SET_PDEATHSIG`), and stopped, the whole group, when
//! its deadline passes, when a directory it writes grows past a cap, or when the lease is lost.
//! Nothing a child does can hold a runner longer than its deadline.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// What a child may use: wall-clock time, and at most `bytes` on disk under `dir`.
pub struct Limits<'a> {
    pub deadline: Duration,
    pub disk: Option<(&'a Path, u64)>,
}

/// How a child ended.
#[derive(Debug)]
pub enum Ended {
    Exited(ExitStatus),
    /// Killed at its deadline.
    Deadline,
    /// Killed when its directory held more than its cap (the bytes seen).
    Disk(u64),
}

/// How often a running child's limits are looked at (the disk less often: it walks a tree).
const POLL: Duration = Duration::from_millis(100);
const DISK_POLL: Duration = Duration::from_secs(2);

/// Runs `cmd` to its end or a limit, its output to `log`; killed (and an error) when `lost` is
/// set (the lease went to another runner).
pub fn run(mut cmd: Command, log: &Path, lost: &AtomicBool, limits: Limits) -> Result<Ended> {
    use std::os::unix::process::CommandExt;
    let out = std::fs::File::create(log).with_context(|| log.display().to_string())?;
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    // SAFETY: prctl and setpgid in the child between fork and exec, async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            libc::setpgid(0, 0);
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting a child")?;
    let kill = |child: &mut std::process::Child| {
        // SAFETY: signalling the process group this child leads.
        unsafe {
            libc::kill(-(child.id() as i32), libc::SIGKILL);
        }
        let _ = child.wait();
    };
    let t0 = Instant::now();
    let mut disk_at = t0;
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok(Ended::Exited(st));
        }
        if lost.load(Ordering::Acquire) {
            kill(&mut child);
            bail!("the lease was lost; the stage was stopped");
        }
        if t0.elapsed() >= limits.deadline {
            kill(&mut child);
            return Ok(Ended::Deadline);
        }
        if let Some((dir, cap)) = limits.disk {
            if disk_at.elapsed() >= DISK_POLL {
                disk_at = Instant::now();
                let used = disk_use(dir);
                if used > cap {
                    kill(&mut child);
                    return Ok(Ended::Disk(used));
                }
            }
        }
        std::thread::sleep(POLL);
    }
}

/// Bytes of the files under `dir` (not following links); what cannot be read counts as nothing.
pub fn disk_use(dir: &Path) -> u64 {
    let mut total = 0;
    let mut todo: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => todo.push(e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

/// The last `lines` lines of a log.
pub fn tail(log: &Path, lines: usize) -> String {
    let t = std::fs::read_to_string(log).unwrap_or_default();
    let v: Vec<&str> = t.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }

    #[test]
    fn a_child_past_its_deadline_is_killed_with_what_it_started() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let lost = AtomicBool::new(false);
        let pidfile = dir.path().join("pid");
        let script = format!("sleep 300 & echo $! > {}; wait", pidfile.display());
        let limits = Limits {
            deadline: Duration::from_millis(500),
            disk: None,
        };
        let t0 = Instant::now();
        let ended = run(sh(&script), &log, &lost, limits).unwrap();
        assert!(matches!(ended, Ended::Deadline), "{ended:?}");
        assert!(t0.elapsed() < Duration::from_secs(60));
        // The grandchild went with it: its group was killed.
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let alive = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.split_whitespace().nth(2).is_none_or(|st| st != "Z"));
        assert!(!alive, "the child's own child outlived the deadline");
        let ended = run(
            sh("exit 3"),
            &log,
            &lost,
            Limits {
                deadline: Duration::from_secs(60),
                disk: None,
            },
        )
        .unwrap();
        assert!(
            matches!(ended, Ended::Exited(st) if st.code() == Some(3)),
            "{ended:?}"
        );
    }

    #[test]
    fn a_child_that_fills_its_directory_past_the_cap_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir(&work).unwrap();
        let log = dir.path().join("log");
        let script = format!(
            "head -c 3000000 /dev/zero > {}/big; sleep 300",
            work.display()
        );
        let limits = Limits {
            deadline: Duration::from_secs(120),
            disk: Some((&work, 1_000_000)),
        };
        let ended = run(sh(&script), &log, &AtomicBool::new(false), limits).unwrap();
        assert!(
            matches!(ended, Ended::Disk(n) if n >= 3_000_000),
            "{ended:?}"
        );
        assert_eq!(disk_use(&work), 3_000_000);
    }
}
