//! The kernels stage of a CUDA track: each build's kernel modules compiled once, by the build's
//! own binary (`fastdecode kernels`) inside its sandbox, into a directory of this runner's cache
//! named by the binary's digest. Only that compile writes it; every later worker of the same
//! build (gate, pricing) gets it read-only at `/kernels`, and no other build ever sees it. So no
//! gated or timed worker compiles anything, and no build can plant modules another one loads.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;

use super::{failed, ok, overrun, Outcome, Runner};
use crate::api::Job;
use crate::runner::child::{self, Ended, Limits};
use crate::runner::sandbox::Mount;
use crate::track::Track;

/// The variable a worker reads its compiled modules' directory from (crates/cuda/src/nvrtc.rs).
pub const PREBUILT_VAR: &str = "FASTDECODE_KERNELS";

/// The most a build's compiled modules may take on disk.
const KERNELS_BYTES: u64 = 1 << 30;

impl Runner {
    pub(super) fn kernels(&self, job: &Job, lost: &AtomicBool) -> Result<Outcome> {
        let t = &job.track;
        let (cand, base) = self.binaries(job)?;
        let mut said = vec![];
        let mut seconds = serde_json::Map::new();
        for (who, bin) in [("baseline", &base), ("candidate", &cand)] {
            let t0 = Instant::now();
            let how = match self.compile_kernels(t, bin, lost)? {
                Ok(how) => how,
                Err(o) if who == "baseline" => {
                    return Ok(Outcome {
                        result: o.result,
                        ..failed(
                            "infra:baseline_kernels",
                            format!("the pinned baseline's kernels: {}", o.detail),
                        )
                    })
                }
                Err(o) => return Ok(o),
            };
            let s = t0.elapsed().as_secs_f64();
            said.push(format!("{who} {how} ({s:.1} s)"));
            seconds.insert(who.into(), json!(s));
        }
        Ok(ok(said.join("; "), json!({ "seconds": seconds })))
    }

    /// The directory of `bin`'s compiled modules, if they were compiled (CUDA tracks).
    pub(super) fn kernels_of(&self, bin: &Path) -> Result<Option<PathBuf>> {
        let name = bin.file_name().context("an artifact has a name")?;
        let dir = self.dir("kernels")?.join(name);
        Ok(dir.is_dir().then_some(dir))
    }

    /// Gives a trusted reference (the pinned baseline, run unsandboxed by `gate`, `price` and
    /// `golden make`) its compiled modules; the candidate's wrapper sets its own.
    pub(super) fn reference_env(&self, c: &mut Command, base: &Path) -> Result<()> {
        if let Some(k) = self.kernels_of(base)? {
            c.env(PREBUILT_VAR, k);
        }
        Ok(())
    }

    /// Compiles `bin`'s modules once: `Ok` says how (compiled, or already there).
    fn compile_kernels(
        &self,
        t: &Track,
        bin: &Path,
        lost: &AtomicBool,
    ) -> Result<std::result::Result<&'static str, Outcome>> {
        if self.kernels_of(bin)?.is_some() {
            return Ok(Ok("already compiled"));
        }
        let root = self.dir("kernels")?;
        let tmp = tempfile::Builder::new()
            .prefix(".compiling-")
            .tempdir_in(&root)?;
        self.sandbox.give(tmp.path())?;
        let mounts = [Mount::rw(tmp.path(), "/kernels"), Mount::same(bin)];
        let mut c = self.sandbox.command(&mounts, &[], bin);
        c.args(["kernels", "--out", "/kernels/modules"]);
        let limits = Limits {
            deadline: Duration::from_secs_f64(t.deadlines.kernels),
            disk: Some((tmp.path(), KERNELS_BYTES)),
        };
        let log = tmp.path().with_extension("log");
        self.progress.say("compiling the kernel modules");
        let ended = child::run(c, &log, lost, limits)?;
        let tail = child::tail(&log, 20);
        let _ = std::fs::remove_file(&log);
        if let Some(what) = overrun(&ended) {
            return Ok(Err(failed(
                format!("kernels:{what}"),
                format!("compiling the kernels was stopped at the track's {what} limit"),
            )));
        }
        if !matches!(ended, Ended::Exited(st) if st.success()) {
            return Ok(Err(Outcome {
                // Private: what the build's own binary said.
                result: json!({ "log_tail": tail }),
                ..failed(
                    "kernels:failed",
                    "the build's `fastdecode kernels` made no modules (NVRTC refused them, or \
                     found no GPU); `fastdecode kernels --arch sm_90a --out DIR` of the tree shows why",
                )
            }));
        }
        let dst = root.join(bin.file_name().context("an artifact has a name")?);
        if std::fs::rename(tmp.path().join("modules"), &dst).is_err() && !dst.is_dir() {
            return Ok(Err(failed(
                "kernels:failed",
                "the build's kernels command wrote no modules",
            )));
        }
        Ok(Ok("compiled"))
    }
}
