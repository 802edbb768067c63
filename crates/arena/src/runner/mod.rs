//! The runner (`fastdecode arena runner`): the trusted parent on a build or timing machine. It
//! leases one job at a time, heartbeats while it works, runs the stage and reports it; the
//! candidate only ever runs as a child of `fastdecode gate` and `fastdecode price`, which this
//! binary drives as they are. Every child dies with the runner (`PR_SET_PDEATHSIG`), so a
//! killed runner leaves no worker behind: its lease expires and another runner resumes.

//!
//! A submission's stages on a runner, one file each: `checks` (policy and review), `build`,
//! `kernels` (a CUDA build's modules, compiled once), `gate`, `price`, `profile` (a profile
//! run's per-op times and kernel timeline, parsed and bounded by `crate::profile`). Every child a stage
//! starts has a deadline (`child`); nothing the candidate writes becomes a stage's public
//! detail, only the runner's own words.
//!
//! What those stages work with is in this folder too: `policy` and `review` (the rules that
//! `checks` applies), `builder` (a build's own directory, its seed and the build cache),
//! `sandbox` (bubblewrap around every candidate process) and `child` (a stage's child process).

mod build;
pub mod builder;
mod checks;
pub mod child;
mod gate;
mod kernels;
pub mod policy;
mod price;
mod profile;
mod progress;
pub mod review;
pub mod sandbox;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::api::{Heartbeat, Job, LeaseRequest, Report, ReportReply};
use crate::bundle::{self, digest};
use crate::http::Api;
use crate::service::stages;
use crate::store::{keep_by_digest, write_atomic};
use crate::track::{Hidden, Track};
use child::{Ended, Limits};
use progress::Progress;
use sandbox::Sandbox;

pub struct Options {
    pub server: String,
    pub token: String,
    pub kind: String,
    pub cache: PathBuf,
    pub reviewer: Option<String>,
    pub poll: Duration,
}

/// How one stage ended: `ok` or a category, the public detail (the runner's own words), the
/// private result, and whether a failure was the candidate's own process's doing.
struct Outcome {
    outcome: String,
    detail: String,
    result: Value,
    candidate_caused: bool,
}

fn ok(detail: impl Into<String>, result: Value) -> Outcome {
    Outcome {
        outcome: "ok".into(),
        detail: detail.into(),
        result,
        candidate_caused: false,
    }
}

fn failed(category: impl Into<String>, detail: impl Into<String>) -> Outcome {
    Outcome {
        outcome: category.into(),
        detail: detail.into(),
        result: Value::Null,
        candidate_caused: false,
    }
}

/// A gate failure's step, bucketed to 32 so a failure never pins down a hidden token.
pub fn bucket(step: u64) -> String {
    let lo = step / 32 * 32;
    format!("steps {lo}-{}", lo + 31)
}

struct Runner {
    api: Api,
    opts: Options,
    builder: bool,
    me: PathBuf,
    sandbox: Sandbox,
    /// What the running stage is doing, for the heartbeat.
    progress: Progress,
}

/// What the gate and the pricing judge a build with: the candidate's and the pinned baseline's
/// binaries, the model's worker options, the track's hidden material.
struct Judged {
    cand: PathBuf,
    base: PathBuf,
    model: Vec<String>,
    hidden: Hidden,
}

/// A child's end that is not its own exit: past its deadline, or over its disk cap.
fn overrun(ended: &Ended) -> Option<&'static str> {
    match ended {
        Ended::Exited(_) => None,
        Ended::Deadline => Some("deadline"),
        Ended::Disk(_) => Some("disk"),
    }
}

impl Runner {
    fn dir(&self, sub: &str) -> Result<PathBuf> {
        let d = self.opts.cache.join(sub);
        std::fs::create_dir_all(&d).with_context(|| d.display().to_string())?;
        Ok(d)
    }

    /// The tree of `commit`, extracted once.
    fn tree(&self, commit: &str) -> Result<PathBuf> {
        let trees = self.dir("trees")?;
        let dst = trees.join(commit);
        if dst.is_dir() {
            return Ok(dst);
        }
        let tar = self
            .api
            .get_bytes(&format!("/api/trees/{commit}"))?
            .with_context(|| format!("the service has no tree {commit}"))?;
        let tmp = tempfile::tempdir_in(&trees)?;
        tar::Archive::new(tar.as_slice())
            .unpack(tmp.path())
            .with_context(|| format!("unpacking the tree of {commit}"))?;
        let kept = tmp.keep();
        if let Err(e) = std::fs::rename(&kept, &dst) {
            // Another runner of this cache extracted it first.
            let _ = std::fs::remove_dir_all(&kept);
            if !dst.is_dir() {
                return Err(e).with_context(|| dst.display().to_string());
            }
        }
        Ok(dst)
    }

    /// An artifact's bytes' local copy, fetched once and checked against its digest. The cache
    /// is shared by the runners of a machine: a copy there is never replaced, as another
    /// runner's worker may be running it (`keep_by_digest`).
    fn artifact(&self, d: &str, executable: bool) -> Result<PathBuf> {
        let p = self.dir("artifacts")?.join(d.replacen(':', "-", 1));
        keep_by_digest(&p, artifact_mode(executable), || {
            let bytes = self
                .api
                .get_bytes(&format!("/api/artifacts/{d}"))?
                .with_context(|| format!("the service has no artifact {d}"))?;
            if digest(&bytes) != d {
                bail!("artifact {d}: the service sent other bytes");
            }
            Ok(bytes)
        })?;
        Ok(p)
    }

    fn hidden(&self, t: &Track) -> Result<Hidden> {
        let bytes = self
            .api
            .get_bytes(&format!("/api/hidden/{}", t.goldens.hidden))?
            .with_context(|| format!("the service has no hidden material {}", t.goldens.hidden))?;
        if digest(&bytes) != t.goldens.hidden {
            bail!(
                "hidden material {}: the service sent other bytes",
                t.goldens.hidden
            );
        }
        let h: Hidden = serde_json::from_slice(&bytes).context("the hidden material")?;
        h.validate()?;
        Ok(h)
    }

    fn bundle_files(&self, job: &Job) -> Result<Vec<(String, Vec<u8>, u32)>> {
        let p = self.artifact(&job.bundle_digest, false)?;
        Ok(
            bundle::read(&std::fs::read(p)?, job.track.caps.total_bytes)?
                .into_iter()
                .map(|e| (e.path, e.data, e.mode))
                .collect(),
        )
    }

    fn work(&self, job: &Job, lost: &AtomicBool) -> Result<Outcome> {
        match job.stage.as_str() {
            stages::POLICY => self.policy(job),
            stages::REVIEW => self.review(job),
            stages::BUILD => self.build(job, lost),
            stages::KERNELS => self.kernels(job, lost),
            stages::GATE => self.gate(job, lost),
            stages::PRICE | stages::CONFIRM => self.price(job, lost),
            stages::PROFILE => self.profile(job, lost),
            s => bail!("a stage this runner does not know: {s}"),
        }
    }

    /// The worker options of the track's model (`--model DIR` or `--synthetic`), checked.
    fn model_args(
        &self,
        t: &Track,
        lost: &AtomicBool,
    ) -> Result<std::result::Result<Vec<String>, Outcome>> {
        let mut args = vec!["--backend".to_string(), t.model.backend.clone()];
        if let Some(dir) = &t.model.dir {
            let path = self.tree(&t.baseline)?.join(dir);
            let marker =
                self.dir("verified")?
                    .join(format!("{}-{}", t.baseline, dir.replace('/', "_")));
            if !marker.is_file() {
                let log = marker.with_extension("log");
                let mut c = Command::new(&self.me);
                c.arg("verify").arg(&path);
                let limits = Limits {
                    deadline: Duration::from_secs(600),
                    disk: None,
                };
                let st = child::run(c, &log, lost, limits)?;
                let out = std::fs::read_to_string(&log).unwrap_or_default();
                let got = out
                    .lines()
                    .find_map(|l| l.strip_prefix("digest "))
                    .map(str::trim);
                let verified = matches!(st, Ended::Exited(st) if st.success());
                if !verified || got != t.model.digest.as_deref() {
                    return Ok(Err(failed(
                        "infra:model_digest",
                        format!(
                            "the model {dir} of the baseline tree does not verify as {:?}",
                            t.model.digest
                        ),
                    )));
                }
                write_atomic(&marker, b"ok\n")?;
            }
            args.push("--model".into());
            args.push(path.to_string_lossy().into_owned());
        } else if let Some(p) = &t.model.synthetic {
            args.extend([
                "--synthetic".into(),
                p.clone(),
                "--synthetic-seed".into(),
                t.model.seed.to_string(),
            ]);
        }
        Ok(Ok(args))
    }

    /// The gate's and the pricing's inputs, or the stage's outcome when the model does not
    /// verify.
    fn judged_inputs(
        &self,
        job: &Job,
        lost: &AtomicBool,
    ) -> Result<std::result::Result<Judged, Outcome>> {
        let (cand, base) = self.binaries(job)?;
        let model = match self.model_args(&job.track, lost)? {
            Ok(m) => m,
            Err(o) => return Ok(Err(o)),
        };
        let hidden = self.hidden(&job.track)?;
        Ok(Ok(Judged {
            cand,
            base,
            model,
            hidden,
        }))
    }

    /// The candidate and pinned baseline binaries the build stage made, as the gate and the
    /// pricing run them.
    fn binaries(&self, job: &Job) -> Result<(PathBuf, PathBuf)> {
        let (cand, base) = built_binaries(job)?;
        Ok((self.artifact(cand, true)?, self.artifact(base, true)?))
    }
}

/// A cached artifact's permissions: a binary runs as the sandbox's user, a bundle is read.
fn artifact_mode(executable: bool) -> u32 {
    if executable {
        0o755
    } else {
        0o644
    }
}

/// `host:port` of a service URL (the port of its scheme when it has none).
fn host_port(url: &str) -> Result<String> {
    let (scheme, rest) = url.split_once("://").context("--server: a URL")?;
    let authority = rest.split('/').next().unwrap_or("");
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    if authority.is_empty() {
        bail!("--server {url}: no host");
    }
    Ok(
        if authority
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            authority.to_string()
        } else {
            format!("{authority}:{}", if scheme == "https" { 443 } else { 80 })
        },
    )
}

/// Reports a stage, waiting out a service that is down (restarting): a finished stage is
/// worth keeping. An answer (even a refusal: the lease was lost) ends the waiting.
fn report(api: &Api, rep: &Report) -> Result<Option<ReportReply>> {
    let t0 = Instant::now();
    loop {
        match api.post::<_, ReportReply>("/api/runner/report", rep, &[]) {
            Ok(r) => return Ok(r),
            Err(e)
                if e.downcast_ref::<reqwest::Error>().is_some()
                    && t0.elapsed() < REPORT_PATIENCE =>
            {
                eprintln!("runner: the service does not answer ({e:#}); retrying");
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(e) => return Err(e),
        }
    }
}

/// How long a finished stage's report waits for the service.
const REPORT_PATIENCE: Duration = Duration::from_secs(600);

/// Serves jobs until killed.
pub fn run(opts: Options) -> Result<()> {
    // A stage's fetches and uploads wait out a restarting service as long as its report does.
    let api = Api::new(&opts.server, Some(&opts.token))?.with_patience(REPORT_PATIENCE);
    std::fs::create_dir_all(&opts.cache)
        .with_context(|| format!("--cache {}", opts.cache.display()))?;
    let builder = opts.kind == "cpu"
        && Command::new("cargo")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    let me = std::env::current_exe().context("locating this binary")?;
    let sandbox = Sandbox::find(&opts.kind)?;
    let secret = opts.cache.join("goldens").join(".sandbox-probe");
    sandbox
        .probe(&secret, &host_port(&opts.server)?)
        .context("probing the sandbox")?;
    let r = Runner {
        api,
        opts,
        builder,
        me,
        sandbox,
        progress: Progress::new(),
    };
    eprintln!(
        "runner: serving {} ({} kind{}), cache {}; sandbox probed: no network, no cache, no \
         writes to the system, no view of the runner",
        r.opts.server,
        r.opts.kind,
        if r.builder { ", builder" } else { "" },
        r.opts.cache.display()
    );
    loop {
        let leased: Option<Job> = match r.api.post(
            "/api/runner/lease",
            &LeaseRequest { builder: r.builder },
            &[],
        ) {
            Ok(j) => j,
            // A refused token stays refused: say so and stop, not retry it every second.
            Err(e) if crate::http::is_unauthorized(&e) => return Err(e),
            Err(e) => {
                eprintln!("runner: {e:#}; trying again");
                std::thread::sleep(r.opts.poll.max(Duration::from_secs(1)));
                continue;
            }
        };
        let Some(mut job) = leased else {
            std::thread::sleep(r.opts.poll);
            continue;
        };
        loop {
            eprintln!("runner: {} {}", job.submission, job.stage);
            let lost = Arc::new(AtomicBool::new(false));
            let done = Arc::new(AtomicBool::new(false));
            r.progress.start();
            let beat = {
                let (lost, done) = (lost.clone(), done.clone());
                let api = Api::new(&r.opts.server, Some(&r.opts.token))?;
                let mut hb = Heartbeat {
                    submission: job.submission.clone(),
                    lease_id: job.lease_id.clone(),
                    progress: None,
                };
                let progress = r.progress.clone();
                // Often enough that a solver following the stage sees it move.
                let every = Duration::from_secs((job.lease_seconds / 3).clamp(1, 5));
                std::thread::spawn(move || {
                    let mut last = Instant::now();
                    while !done.load(Ordering::Acquire) {
                        std::thread::sleep(Duration::from_millis(100));
                        if last.elapsed() < every {
                            continue;
                        }
                        last = Instant::now();
                        hb.progress = progress.line();
                        if let Err(e) = api.post::<_, Value>("/api/runner/heartbeat", &hb, &[]) {
                            if format!("{e:#}").contains("409") {
                                lost.store(true, Ordering::Release);
                                return;
                            }
                        }
                    }
                })
            };
            let out = r.work(&job, &lost);
            done.store(true, Ordering::Release);
            let _ = beat.join();
            let out = match out {
                Ok(o) => o,
                Err(e) if lost.load(Ordering::Acquire) => {
                    eprintln!("runner: {} {}: {e:#}", job.submission, job.stage);
                    break;
                }
                // The runner's own trouble (a download, a disk): infra, never the solver's.
                Err(e) => failed("infra:runner", format!("{e:#}")),
            };
            eprintln!(
                "runner: {} {}: {} {}",
                job.submission,
                job.stage,
                out.outcome,
                out.detail.lines().next().unwrap_or("")
            );
            let rep = Report {
                submission: job.submission.clone(),
                lease_id: job.lease_id.clone(),
                stage: job.stage.clone(),
                outcome: out.outcome,
                detail: out.detail,
                result: out.result,
                builder: r.builder,
                candidate_caused: out.candidate_caused,
            };
            match report(&r.api, &rep) {
                Ok(Some(ReportReply { next: Some(next) })) => job = next,
                Ok(_) => break,
                Err(e) => {
                    eprintln!("runner: reporting {} {}: {e:#}", job.submission, job.stage);
                    break;
                }
            }
        }
    }
}

/// The artifact names of the candidate and baseline binaries in a job's build result. A job whose
/// results lack them (a service that leased the gate without a recorded build) is refused with
/// an error naming the submission, not a panic of the runner.
fn built_binaries(job: &Job) -> Result<(&str, &str)> {
    let b = job.results.get(stages::BUILD);
    let (Some(cand), Some(base)) = (
        b.and_then(|b| b["candidate"].as_str()),
        b.and_then(|b| b["baseline"].as_str()),
    ) else {
        bail!(
            "submission {}: the job has no build result with candidate and baseline binaries",
            job.submission
        );
    };
    Ok((cand, base))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_without_its_build_result_is_an_error_naming_it() {
        let track = crate::track::repo_tracks().remove("serial-tiny").unwrap();
        let mut job = Job {
            submission: "s-42".into(),
            lease_id: "l".into(),
            lease_seconds: 60,
            stage: stages::GATE.into(),
            track,
            base_commit: "c".into(),
            bundle_digest: "d".into(),
            results: std::collections::BTreeMap::new(),
        };
        let e = built_binaries(&job).unwrap_err().to_string();
        assert!(e.contains("s-42") && e.contains("build result"), "{e}");
        job.results.insert(
            stages::BUILD.into(),
            serde_json::json!({ "candidate": "cand-x" }),
        );
        assert!(
            built_binaries(&job).is_err(),
            "a build result without the baseline"
        );
        job.results.insert(
            stages::BUILD.into(),
            serde_json::json!({ "candidate": "cand-x", "baseline": "base-y" }),
        );
        assert_eq!(built_binaries(&job).unwrap(), ("cand-x", "base-y"));
    }

    #[test]
    fn steps_are_bucketed_to_32() {
        assert_eq!(bucket(0), "steps 0-31");
        assert_eq!(bucket(38), "steps 32-63");
        assert_eq!(bucket(64), "steps 64-95");
    }

    #[test]
    fn the_service_address_is_found_in_its_url() {
        assert_eq!(
            host_port("http://127.0.0.1:8417").unwrap(),
            "127.0.0.1:8417"
        );
        assert_eq!(
            host_port("https://arena.example/x").unwrap(),
            "arena.example:443"
        );
        assert_eq!(host_port("http://u@h:1/").unwrap(), "h:1");
        assert!(host_port("nonsense").is_err());
    }
}
