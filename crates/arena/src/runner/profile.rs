//! The profile stage of a `profile` run, after its pricing, on the same kind of runner: the
//! candidate's own `fastdecode bench --profile --json` on the track's model, a random prompt of
//! the window's length (never a hidden one) and 32 decode steps, sandboxed as every candidate
//! process is, with a deadline (the track's `deadlines.profile`, each child) and a cap on what
//! it writes; on a CUDA track then `bench --trace`
//! (kernels compiled with `-DFD_TRACE`, in the sandbox) for the per-kernel timeline of two decode
//! steps. What the build printed and wrote is read bounded and parsed here (`crate::profile`);
//! the stage's detail and the profile's note are the runner's own words, never the build's
//! text. A profile that cannot be had (the build's `bench` has no per-op profile, crashed, ran
//! past its deadline, printed nonsense) is reported as such: the pricing stands either way.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::json;

use super::child::{self, Ended, Limits};
use super::sandbox::Mount;
use super::{ok, Outcome, Runner};
use crate::api::Job;
use crate::profile::{self, Profile};
use crate::track::Track;

/// The most bytes a profiling child may leave in its directory (its output and its trace, which
/// may be up to `profile::TRACE_MAX`).
const DISK: u64 = 256 << 20;
/// Decode tokens of the profiled run.
const DECODE_TOKENS: usize = 32;
/// A build's per-op tables: its decode step's and its prefill's.
type Tables = (Vec<profile::OpTime>, Vec<profile::OpTime>);

/// Where the sandbox sees the directory a trace is written to.
const OUT: &str = "/profile-out";

/// What a profiling child left: its output (bounded), or why it has none.
fn read_capped(path: &Path, cap: usize) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::OpenOptionsExt;
    // The candidate could leave a link to a file of the runner's: never followed.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|_| "it wrote no output file".to_string())?;
    if !f.metadata().is_ok_and(|m| m.is_file()) {
        return Err("its output is not a file".into());
    }
    let mut buf = vec![];
    f.take(cap as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|_| "its output could not be read".to_string())?;
    if buf.len() > cap {
        return Err(format!("it wrote more than {cap} bytes"));
    }
    Ok(buf)
}

/// `bench`'s model options from the worker's (`--synthetic-seed` is `bench`'s `--seed`).
fn bench_model_args(model: &[String]) -> Vec<String> {
    model
        .iter()
        .map(|a| match a.as_str() {
            "--synthetic-seed" => "--seed".to_string(),
            _ => a.clone(),
        })
        .collect()
}

/// The words for a profiling child that did not end well (no text of the build's), whose
/// deadline was `deadline` seconds.
fn ended_badly(ended: &Ended, flag: &str, deadline: f64) -> Option<String> {
    match ended {
        Ended::Exited(st) if st.success() => None,
        Ended::Exited(st) => Some(format!(
            "the build's `fastdecode bench {flag}` exited with {st} (a build whose base \
             predates the per-op profile of its backend has none)"
        )),
        Ended::Deadline => Some(format!(
            "the profiling ran past its deadline of {deadline:.0} s (deadlines.profile) and was \
             stopped"
        )),
        Ended::Disk(_) => Some(format!(
            "the profiling wrote more than {DISK} bytes and was stopped"
        )),
    }
}

impl Runner {
    pub(super) fn profile(&self, job: &Job, lost: &AtomicBool) -> Result<Outcome> {
        let t = &job.track;
        let (cand, _) = self.binaries(job)?;
        let model = match self.model_args(t, lost)? {
            Ok(m) => m,
            Err(o) => return Ok(o),
        };
        let work = tempfile::tempdir_in(self.dir("work")?)?;
        let ops = self.profile_ops(t, &cand, &model, work.path(), lost)?;
        let (decode, prefill, mut note) = match ops {
            Ok((d, p)) => (
                d,
                p,
                format!(
                    "per-op times of the build's forward: a decode step (ms/token, over \
                     {DECODE_TOKENS} steps) and the prefill of a random {}-token prompt",
                    t.window.prompt_tokens
                ),
            ),
            Err(why) => (vec![], vec![], format!("no per-op times: {why}")),
        };
        let timeline = if t.model.backend == "cuda" {
            match self.profile_timeline(t, &cand, &model, work.path(), lost)? {
                Ok(tl) => Some(tl),
                Err(why) => {
                    note += &format!("; no kernel timeline: {why}");
                    None
                }
            }
        } else {
            note += "; no kernel timeline: a CPU track has none (the per-kernel timeline is of \
                     CUDA tracks only)";
            None
        };
        let mut p = Profile {
            backend: t.model.backend.clone(),
            prompt_tokens: t.window.prompt_tokens,
            decode,
            prefill,
            timeline,
            note,
        };
        // The service checks it again; one the parsing made and the check refuses would be a
        // bug here, reported as such rather than sent.
        if let Err(e) = p.check() {
            p = Profile::unavailable(
                &t.model.backend,
                t.window.prompt_tokens,
                &format!("no profile: the runner's parse of it is out of bounds ({e})"),
            );
        }
        let detail = match (p.decode.len(), &p.timeline) {
            (0, _) => p.note.clone(),
            (n, Some(tl)) => format!(
                "{n} op(s) timed, {} kernel launches on the timeline",
                tl.launches.len()
            ),
            (n, None) => format!("{n} op(s) timed; no kernel timeline"),
        };
        Ok(ok(detail, json!({ "profile": p })))
    }

    /// The build's `bench` in the sandbox, with `extra` options, its output to `log`; a trace
    /// directory mounted writable at `OUT` when `trace_dir` is given.
    #[allow(clippy::too_many_arguments)]
    fn bench_child(
        &self,
        t: &Track,
        cand: &Path,
        model: &[String],
        work: &Path,
        name: &str,
        extra: &[&str],
        trace_dir: Option<&Path>,
        lost: &AtomicBool,
    ) -> Result<(Ended, PathBuf)> {
        let mut mounts: Vec<Mount> = super::gate::model_mount(model).into_iter().collect();
        let mut env: Vec<(&str, &OsStr)> = vec![];
        if let Some(d) = trace_dir {
            mounts.push(Mount::rw(d, OUT));
            // Kernels compiled with the trace's stamps, in the sandbox (not the kernels stage's
            // modules, built without them).
            env.push(("FASTDECODE_NVRTC_DEFINES", OsStr::new("-DFD_TRACE")));
        } else if let Some(k) = self.kernels_of(cand)? {
            mounts.push(Mount::ro(&k, "/kernels"));
            env.push((super::kernels::PREBUILT_VAR, OsStr::new("/kernels")));
        }
        let wrapper =
            self.sandbox
                .wrapper(cand, &mounts, &env, &work.join(format!("{name}-sandbox")))?;
        let w = &t.window;
        let mut cmd = Command::new(wrapper);
        cmd.arg("bench")
            .args(bench_model_args(model))
            .args(["--prompt-tokens", &w.prompt_tokens.to_string()])
            .args(["--decode-tokens", &DECODE_TOKENS.to_string()])
            .args(["--repeats", "1", "--json"]);
        if t.model.backend == "cpu" {
            // The CPU bench times DFlash too: the window's, or the cheapest (oracle drafts).
            if t.clock_track == "dflash" {
                cmd.args([
                    "--block-sizes",
                    &w.block_size.to_string(),
                    "--draft",
                    &w.draft,
                ]);
            } else {
                cmd.args(["--block-sizes", "2", "--draft", "oracle:1"]);
            }
        }
        cmd.args(extra);
        let log = work.join(format!("{name}.out"));
        let limits = Limits {
            deadline: Duration::from_secs_f64(t.deadlines.profile),
            disk: Some((work, DISK)),
        };
        Ok((child::run(cmd, &log, lost, limits)?, log))
    }

    /// The per-op tables (decode, prefill) of the build, or why none.
    fn profile_ops(
        &self,
        t: &Track,
        cand: &Path,
        model: &[String],
        work: &Path,
        lost: &AtomicBool,
    ) -> Result<std::result::Result<Tables, String>> {
        let (ended, log) =
            self.bench_child(t, cand, model, work, "ops", &["--profile"], None, lost)?;
        if let Some(why) = ended_badly(&ended, "--profile", t.deadlines.profile) {
            return Ok(Err(why));
        }
        Ok(read_capped(&log, profile::OUTPUT_MAX)
            .map_err(|e| format!("the profile's output: {e}"))
            .and_then(|out| profile::ops_from_bench(&out)))
    }

    /// The kernel timeline of two decode steps (a CUDA track), or why none.
    fn profile_timeline(
        &self,
        t: &Track,
        cand: &Path,
        model: &[String],
        work: &Path,
        lost: &AtomicBool,
    ) -> Result<std::result::Result<profile::Timeline, String>> {
        let dir = work.join("trace");
        std::fs::create_dir(&dir).with_context(|| dir.display().to_string())?;
        self.sandbox.give(&dir)?;
        let file = format!("{OUT}/trace.csv");
        let (ended, _) = self.bench_child(
            t,
            cand,
            model,
            work,
            "trace",
            &["--trace", &file],
            Some(&dir),
            lost,
        )?;
        if let Some(why) = ended_badly(&ended, "--trace", t.deadlines.profile) {
            return Ok(Err(why));
        }
        Ok(read_capped(&dir.join("trace.csv"), profile::TRACE_MAX)
            .map_err(|e| format!("the trace: {e}"))
            .and_then(|csv| profile::timeline_from_csv(&csv)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_left_by_the_candidate_is_not_followed_and_output_is_capped() {
        let d = tempfile::tempdir().unwrap();
        let secret = d.path().join("secret");
        std::fs::write(&secret, b"hidden").unwrap();
        let link = d.path().join("trace.csv");
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        assert_eq!(
            read_capped(&link, 100).unwrap_err(),
            "it wrote no output file"
        );
        let big = d.path().join("big");
        std::fs::write(&big, vec![b'x'; 101]).unwrap();
        assert!(read_capped(&big, 100)
            .unwrap_err()
            .contains("more than 100"));
        assert_eq!(read_capped(&big, 101).unwrap().len(), 101);
        assert!(read_capped(d.path(), 100).is_err(), "a directory");
    }

    #[test]
    fn benchs_seed_is_the_workers_synthetic_seed() {
        let m: Vec<String> = [
            "--backend",
            "cuda",
            "--synthetic",
            "xs2.1",
            "--synthetic-seed",
            "3",
        ]
        .map(String::from)
        .into();
        assert_eq!(
            bench_model_args(&m),
            ["--backend", "cuda", "--synthetic", "xs2.1", "--seed", "3"]
        );
    }
}
