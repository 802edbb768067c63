//! The gate stage: goldens made by the pinned baseline (once per set), then `fastdecode gate`
//! with the candidate sandboxed, on the public golden and then the hidden ones.
//!
//! What a failure says is the runner's choice, never the candidate's: on the public golden its
//! category and a step bucketed to 32; on hidden goldens one category (`gate:hidden_golden`)
//! whatever the candidate did, with no step, so the way a build fails cannot spell out what it
//! was fed. A failure of the pinned baseline's own worker is the runner's (`infra:reference`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::{json, Value};

use super::{bucket, failed, ok, overrun, Judged, Outcome, Runner};
use crate::api::Job;
use crate::bundle::digest;
use crate::runner::builder;
use crate::runner::child::{self, Limits};
use crate::runner::sandbox::Mount;
use crate::track::Track;

/// The one category of every candidate-caused failure on a hidden golden.
pub const HIDDEN_GOLDEN: &str = "gate:hidden_golden";

/// What a golden set's failure report says, as the stage reports it.
fn judged(rep: &Value, public: bool) -> Outcome {
    let f = &rep["failure"];
    let cat = f["category"].as_str().unwrap_or("unknown");
    let side = f["side"].as_str();
    if side == Some("reference")
        || cat.starts_with("infra:reference")
        || cat == "golden_model_mismatch"
    {
        return failed(
            "infra:reference",
            format!("the pinned baseline's worker failed ({cat}); the stage runs again"),
        );
    }
    if !public {
        return failed(HIDDEN_GOLDEN, "in a hidden golden");
    }
    let category = if cat.starts_with("infra:") || cat.starts_with("violation:") {
        cat.to_string()
    } else {
        format!("gate:{cat}")
    };
    let mut detail = "in the public golden".to_string();
    if let Some(s) = f["step"].as_u64() {
        detail += &format!(" at {}", bucket(s));
    }
    Outcome {
        candidate_caused: category.starts_with("infra:"),
        ..failed(category, detail)
    }
}

impl Runner {
    pub(super) fn gate(&self, job: &Job, lost: &AtomicBool) -> Result<Outcome> {
        let t = &job.track;
        let Judged {
            cand,
            base,
            model,
            hidden,
        } = match self.judged_inputs(job, lost)? {
            Ok(j) => j,
            Err(o) => return Ok(o),
        };
        let mut counts = BTreeMap::new();
        let mut times = vec![];
        for (name, seed, count, public) in [
            (
                "public",
                t.goldens.public_seed,
                t.goldens.public_count,
                true,
            ),
            (
                "hidden",
                hidden.golden_seeds[0],
                t.goldens.hidden_count,
                false,
            ),
        ] {
            let t0 = Instant::now();
            self.progress.say(format!("making the {name} goldens"));
            let Ok(dir) = self.goldens(t, &base, &model, (name, seed, count), lost)? else {
                // The pinned baseline itself could not make them: the operator's problem.
                return Ok(failed(
                    "infra:golden_make",
                    format!("the pinned baseline could not make the {name} goldens"),
                ));
            };
            times.push(format!(
                "{name} goldens {:.1} s",
                t0.elapsed().as_secs_f64()
            ));
            let t0 = Instant::now();
            self.progress.say(format!("replaying the {name} goldens"));
            let rep = match self.gate_one(t, (&cand, &base), &model, &dir, lost)? {
                Ok(r) => r,
                Err(o) => return Ok(o),
            };
            times.push(format!(
                "{name} gate {:.1} s (candidate ready in {:.1} s, reference in {:.1} s)",
                t0.elapsed().as_secs_f64(),
                rep["candidate_ready_seconds"].as_f64().unwrap_or(f64::NAN),
                rep["reference_ready_seconds"].as_f64().unwrap_or(f64::NAN)
            ));
            if rep["passed"] != json!(true) {
                return Ok(judged(&rep, public));
            }
            counts.insert(
                name,
                json!({"replay": rep["replay"], "fidelity": rep["fidelity"], "goldens": count}),
            );
        }
        Ok(ok(
            format!(
                "public golden and {} hidden golden(s): exact (within the near-tie budget); {}",
                t.goldens.hidden_count,
                times.join(", ")
            ),
            json!(counts),
        ))
    }

    /// One `fastdecode gate` run on the goldens of `dir`: its report, or the stage's outcome
    /// when it wrote none or ran out of time.
    fn gate_one(
        &self,
        t: &Track,
        (cand, base): (&Path, &Path),
        model: &[String],
        dir: &Path,
        lost: &AtomicBool,
    ) -> Result<std::result::Result<Value, Outcome>> {
        let work = tempfile::tempdir_in(self.dir("work")?)?;
        let report = work.path().join("gate.json");
        let mut c = Command::new(&self.me);
        c.arg("gate")
            .arg("--reference")
            .arg(base)
            .arg("--candidate")
            .arg(self.sandboxed(cand, model, &work.path().join("candidate"))?)
            .arg("--golden")
            .arg(dir)
            .args(model)
            .args(["--block-size", &t.goldens.block_size.to_string()]);
        if t.clock_track == "dflash" {
            // The source the pricing drafts with must be exact too, not only the oracle's
            // forced rejections.
            c.args(["--draft", &t.window.draft])
                .args(["--draft-block-size", &t.window.block_size.to_string()]);
        }
        c.arg("--json").arg(&report);
        self.reference_env(&mut c, base)?;
        let limits = Limits {
            deadline: Duration::from_secs_f64(t.deadlines.gate),
            disk: None,
        };
        let ended = child::run(c, &work.path().join("gate.log"), lost, limits)?;
        if overrun(&ended).is_some() {
            return Ok(Err(failed(
                "gate:deadline",
                format!(
                    "the gate ran past the track's deadline of {:.0} s and was stopped",
                    t.deadlines.gate
                ),
            )));
        }
        Ok(
            match std::fs::read(&report)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
            {
                Some(r) => Ok(r),
                None => Err(failed("infra:gate_error", "the gate wrote no report")),
            },
        )
    }

    /// Goldens made by the pinned baseline from `seed`, once, in a directory only this runner
    /// reads (hidden ones never leave it).
    fn goldens(
        &self,
        t: &Track,
        baseline: &Path,
        model: &[String],
        (name, seed, count): (&str, u64, usize),
        lost: &AtomicBool,
    ) -> Result<std::result::Result<PathBuf, ()>> {
        use std::os::unix::fs::PermissionsExt;
        let root = self.dir("goldens")?;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))?;
        let g = &t.goldens;
        let key = digest(
            format!(
                "{}|{seed}|{count}|{}|{}|{model:?}",
                baseline.display(),
                g.prompt_tokens,
                g.tokens
            )
            .as_bytes(),
        );
        let dir = root.join(format!("{name}-{}", &key[7..23]));
        // Runners sharing this cache make each set once.
        let _lock = builder::Lock::take(&root.join("lock"))?;
        if dir.is_dir() {
            return Ok(Ok(dir));
        }
        let log = root.join(format!("{name}.log"));
        let mut c = Command::new(&self.me);
        c.args(["golden", "make", "--reference"])
            .arg(baseline)
            .args(model)
            .args(["--seed", &seed.to_string(), "--count", &count.to_string()])
            .args([
                "--tokens",
                &g.tokens.to_string(),
                "--prompt-tokens",
                &g.prompt_tokens.to_string(),
            ])
            .args(["--attempts-per-golden", &g.attempts_per_golden.to_string()])
            .arg("--out")
            .arg(&dir);
        self.reference_env(&mut c, baseline)?;
        let limits = Limits {
            deadline: Duration::from_secs_f64(t.deadlines.gate),
            disk: None,
        };
        let ended = child::run(c, &log, lost, limits)?;
        Ok(match ended {
            child::Ended::Exited(st) if st.success() => Ok(dir),
            _ => Err(()),
        })
    }

    /// A build as `gate` and `price` start it: a wrapper at `at` that runs it in the sandbox,
    /// seeing the model (the `--model` of `model`, read-only) and its build's compiled kernels
    /// (read-only, at `/kernels`), and nothing else of this machine.
    pub(super) fn sandboxed(&self, build: &Path, model: &[String], at: &Path) -> Result<PathBuf> {
        let mut mounts: Vec<Mount> = model_mount(model).into_iter().collect();
        let kernels = self.kernels_of(build)?;
        let mut env = vec![];
        if let Some(k) = &kernels {
            mounts.push(Mount::ro(k, "/kernels"));
            env.push((super::kernels::PREBUILT_VAR, "/kernels".as_ref()));
        }
        self.sandbox.wrapper(build, &mounts, &env, at)
    }
}

/// The model directory a build's `--model` argument names (of `model`), read-only at its own
/// path in the sandbox; none where the model comes otherwise (`--synthetic`).
pub(super) fn model_mount(model: &[String]) -> Option<Mount> {
    model
        .iter()
        .position(|a| a == "--model")
        .and_then(|i| model.get(i + 1))
        .map(|d| Mount::same(Path::new(d)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(category: &str, step: Option<u64>, side: &str) -> Value {
        json!({"passed": false, "failure": {
            "category": category, "step": step, "side": side,
            "golden": "/runner/goldens/hidden-1/golden-000.json",
            "detail": "SURVEY host=runner uid=0"}})
    }

    /// Whatever a candidate chooses on a hidden golden reads the same; on the public one it reads
    /// as the runner words it, never with the worker's own text.
    #[test]
    fn a_hidden_golden_failure_is_one_category_and_no_worker_text_is_public() {
        let kinds = [
            ("infra:worker_crashed", None),
            ("infra:worker_error", None),
            ("infra:protocol", None),
            ("infra:worker_hung", None),
            ("violation:kv_ledger", None),
            ("fidelity_divergence", Some(5)),
            ("replay_divergence", Some(40)),
            ("near_tie_budget", None),
        ];
        for (cat, step) in kinds {
            let o = judged(&report(cat, step, "candidate"), false);
            assert_eq!(
                (o.outcome.as_str(), o.detail.as_str()),
                (HIDDEN_GOLDEN, "in a hidden golden")
            );
            assert!(!o.candidate_caused, "{cat}: one attributable category");
            let o = judged(&report(cat, step, "candidate"), true);
            assert!(
                !o.detail.contains("SURVEY") && !o.detail.contains("goldens"),
                "{}",
                o.detail
            );
            assert_eq!(o.candidate_caused, cat.starts_with("infra:"), "{cat}");
        }
        let o = judged(&report("fidelity_divergence", Some(38), "candidate"), true);
        assert_eq!(o.outcome, "gate:fidelity_divergence");
        assert_eq!(o.detail, "in the public golden at steps 32-63");
        // The pinned baseline's own worker failing is the runner's trouble, never the solver's.
        for public in [true, false] {
            let o = judged(&report("infra:worker_crashed", None, "reference"), public);
            assert_eq!(o.outcome, "infra:reference");
            assert!(!o.candidate_caused && !o.detail.contains("SURVEY"));
        }
    }
}
