//! The build stage on a builder: the pinned baseline first (trusted; its build becomes the seed
//! later builds copy, `builder`), then the candidate, each in a directory of its own inside the
//! sandbox, each child with a deadline and a disk cap, each binary capped in size.

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;

use super::{failed, ok, overrun, Outcome, Runner};
use crate::api::{BuildRecord, Job};
use crate::bundle::digest;
use crate::runner::builder::{self, BuildDir};
use crate::runner::child::{self, Ended, Limits};
use crate::runner::sandbox::BuildMounts;
use crate::store::{keep_by_digest, write_atomic};
use crate::track::Track;

/// Why a build made no binary.
enum Failure {
    /// The compiler refused the tree: the public summary (error codes), the log's tail (private).
    Compile { summary: String, tail: String },
    /// Killed at the track's deadline or disk cap (`deadline` / `disk`).
    Overrun(&'static str),
    /// A binary larger than the track's cap (its bytes).
    TooLarge(u64),
}

impl Failure {
    /// The candidate's build failure as the stage reports it: attributable, in fixed words.
    fn outcome(self, t: &Track) -> Outcome {
        match self {
            Failure::Compile { summary, tail } => Outcome {
                result: json!({ "log_tail": tail }),
                ..failed("build:failed", summary)
            },
            Failure::Overrun("deadline") => failed(
                "build:deadline",
                format!(
                    "the build ran past the track's deadline of {:.0} s and was stopped",
                    t.deadlines.build
                ),
            ),
            Failure::Overrun(_) => failed(
                "build:disk",
                format!(
                    "the build wrote more than the track's cap of {} bytes and was stopped",
                    t.caps.build_disk_bytes
                ),
            ),
            Failure::TooLarge(n) => failed(
                "build:too_large",
                format!(
                    "the binary is {n} bytes, more than the track's cap of {} bytes",
                    t.caps.artifact_bytes
                ),
            ),
        }
    }
}

type Built = std::result::Result<(BuildRecord, String), Failure>;

impl Runner {
    pub(super) fn build(&self, job: &Job, lost: &AtomicBool) -> Result<Outcome> {
        let t = &job.track;
        let files = self.bundle_files(job)?;
        // The baseline first: it is built once per recipe, and its build seeds the candidate's.
        let base = match self.built(t, &t.baseline, &[], true, lost)? {
            Ok(b) => b,
            Err(f) => {
                let why = match f {
                    Failure::Compile { summary, .. } => summary,
                    Failure::Overrun(what) => format!("stopped at its {what} limit"),
                    Failure::TooLarge(n) => format!("a binary of {n} bytes, over the cap"),
                };
                return Ok(failed(
                    "infra:baseline_build_failed",
                    format!("the pinned baseline does not build: {why}"),
                ));
            }
        };
        let cand = if job.base_commit == t.baseline && files.is_empty() {
            (base.0.clone(), "the same build".into())
        } else {
            match self.built(t, &job.base_commit, &files, false, lost)? {
                Ok(c) => c,
                Err(f) => return Ok(f.outcome(t)),
            }
        };
        Ok(ok(
            format!(
                "candidate {} ({}); pinned baseline {} ({})",
                cand.0.artifact, cand.1, base.0.artifact, base.1
            ),
            json!({
                "candidate": cand.0.artifact,
                "baseline": base.0.artifact,
                "builds": [cand.0, base.0],
            }),
        ))
    }

    /// The binary of `commit` + `files`: from the service's cache, from this runner's own
    /// earlier build of the same inputs, or built here now. `trusted` (the pinned baseline):
    /// its finished build is kept as the seed of later ones.
    fn built(
        &self,
        t: &Track,
        commit: &str,
        files: &[(String, Vec<u8>, u32)],
        trusted: bool,
        lost: &AtomicBool,
    ) -> Result<Built> {
        let recipe = &t.build;
        let key = builder::key(commit, files, recipe);
        if let Some(b) = self.api.get_bytes(&format!("/api/builds/{key}"))? {
            let rec: BuildRecord = serde_json::from_slice(&b)?;
            return Ok(Ok((rec, "cached".into())));
        }
        // One build at a time on this machine: they share its cores.
        let _lock = builder::Lock::take(&self.dir("build")?.join("lock"))?;
        if let Some(rec) = self.built_before(&key)? {
            return Ok(Ok((rec, "built before by this runner".into())));
        }
        let seed = self
            .dir("seeds")?
            .join(&builder::key(&t.baseline, &[], recipe)[7..39]);
        let dir = BuildDir::new(&self.dir("builds")?)?;
        if seed.is_dir() {
            dir.seed_from(&seed)?;
        }
        builder::sync(&self.tree(commit)?, files, &dir.src)?;
        self.sandbox.give(&dir.root)?;
        let t0 = Instant::now();
        let log = dir.root.with_extension("log");
        let registry = builder::registry(&self.opts.cache, self.sandbox.drops_to().is_some())?;
        let mut cmd = self.sandbox.cargo(&BuildMounts {
            src: &dir.src,
            target: &dir.target,
            cargo_home: &dir.cargo_home,
            registry: &registry,
        })?;
        cmd.args(&recipe.cargo_args);
        // The pinned baseline is trusted, built once, and often from nothing (no seed yet): it
        // gets four times a candidate's deadline.
        let deadline = t.deadlines.build * if trusted { 4.0 } else { 1.0 };
        let limits = Limits {
            deadline: Duration::from_secs_f64(deadline),
            disk: Some((&dir.root, t.caps.build_disk_bytes)),
        };
        self.progress.say(if trusted {
            "compiling the pinned baseline"
        } else {
            "compiling the candidate"
        });
        let ended = child::run(cmd, &log, lost, limits)?;
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_file(&log);
        if let Some(what) = overrun(&ended) {
            return Ok(Err(Failure::Overrun(what)));
        }
        if !matches!(ended, Ended::Exited(st) if st.success()) {
            let lines: Vec<&str> = text.lines().collect();
            return Ok(Err(Failure::Compile {
                summary: builder::failure_summary(&text),
                tail: lines[lines.len().saturating_sub(40)..].join("\n"),
            }));
        }
        let path = dir.target.join(&recipe.binary);
        let size = std::fs::metadata(&path)
            .context("the build's binary")?
            .len();
        if size > t.caps.artifact_bytes {
            return Ok(Err(Failure::TooLarge(size)));
        }
        let bin = std::fs::read(&path).context("the build's binary")?;
        let rec = self.store(&key, bin)?;
        if trusted {
            dir.keep_as_seed(&seed)?;
        }
        Ok(Ok((
            rec,
            format!("built in {:.0} s", t0.elapsed().as_secs_f64()),
        )))
    }

    /// The same inputs built before by this runner (for another submission, or for another
    /// service: the pinned baseline recurs in every one): its artifact is kept here by digest,
    /// checked, and sent to the service instead of building again.
    fn built_before(&self, key: &str) -> Result<Option<BuildRecord>> {
        let index = self.dir("built")?.join(key.replacen(':', "-", 1));
        let Ok(d) = std::fs::read_to_string(&index) else {
            return Ok(None);
        };
        let d = d.trim();
        let p = self.dir("artifacts")?.join(d.replacen(':', "-", 1));
        match std::fs::read(&p) {
            Ok(bin) if digest(&bin) == d => {
                self.api.put_bytes(&format!("/api/artifacts/{d}"), bin)?;
                Ok(Some(BuildRecord {
                    build_key: key.to_string(),
                    artifact: d.to_string(),
                }))
            }
            _ => Ok(None),
        }
    }

    /// Stores a new binary: with the service, in this runner's artifacts, and in its index.
    fn store(&self, key: &str, bin: Vec<u8>) -> Result<BuildRecord> {
        let d = digest(&bin);
        let index = self.dir("built")?.join(key.replacen(':', "-", 1));
        // A reproducible build gives another submission's binary (a no-op re-priced on the
        // base it equals), which a worker of another runner may be running from this cache.
        keep_by_digest(
            &self.dir("artifacts")?.join(d.replacen(':', "-", 1)),
            super::artifact_mode(true),
            || Ok(bin.clone()),
        )?;
        self.api.put_bytes(&format!("/api/artifacts/{d}"), bin)?;
        write_atomic(&index, d.as_bytes())?;
        Ok(BuildRecord {
            build_key: key.to_string(),
            artifact: d,
        })
    }
}
