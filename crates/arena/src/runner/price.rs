//! The price stage (and the confirmation pricing): `fastdecode price` against the pinned
//! baseline on a prompt seed drawn from the hidden pool, the candidate sandboxed.
//!
//! The pool's prompts are hidden material, so every failure the candidate's own process causes
//! there (a crash, a hang, a lie, a timed output the reference disowns, an implausible speed)
//! is one category, `price:hidden_prompt`: how a build fails cannot spell out what it was fed.
//! Its score and interval (public) are the parent's own timings.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Result;
use serde_json::{json, Value};

use super::{failed, ok, overrun, Judged, Outcome, Runner};
use crate::api::Job;
use crate::runner::child::{self, Ended, Limits};
use crate::service::stages;

/// The one category of every candidate-caused failure of a pricing.
pub const HIDDEN_PROMPT: &str = "price:hidden_prompt";

/// A pricing that did not pass, as the stage reports it.
fn priced_failure(verdict: &str, culprit: Option<&str>, detail: String) -> Outcome {
    match (verdict, culprit) {
        ("below_floor", _) => failed("price:below_floor", detail),
        (_, Some("candidate")) => failed(HIDDEN_PROMPT, "on the hidden pool's prompts"),
        (v, _) if v.starts_with("infra:") || v.starts_with("violation:") => failed(v, detail),
        (v, _) => failed(format!("price:{v}"), detail),
    }
}

/// Where the clock says a pricing's time went (its own observations, as the runner words them).
fn spent(s: &Value) -> String {
    let part = |k: &str| s[k].as_f64().unwrap_or(0.0);
    format!(
        "time: noise and pool {:.1} s, start-ups {:.1} s, windows {:.1} s, quiet waits {:.1} s, \
         judging {:.1} s",
        part("noise_and_pool"),
        part("start_ups"),
        part("windows"),
        part("quiet_waits"),
        part("judging")
    )
}

impl Runner {
    pub(super) fn price(&self, job: &Job, lost: &AtomicBool) -> Result<Outcome> {
        let t = &job.track;
        let judged = match self.judged_inputs(job, lost)? {
            Ok(j) => j,
            Err(o) => return Ok(o),
        };
        let hidden = &judged.hidden;
        // One prompt seed of the hidden pool per pricing; a confirmation never reuses the
        // first pricing's.
        let earlier = job
            .results
            .get(stages::PRICE)
            .and_then(|r| r["pool_index"].as_u64());
        let choices: Vec<usize> = (0..hidden.pool_seeds.len())
            .filter(|i| Some(*i as u64) != earlier)
            .collect();
        let index = choices[rand::random_range(0..choices.len())];
        let work = tempfile::tempdir_in(self.dir("work")?)?;
        let out = work.path().join("price");
        let log = work.path().join("price.log");
        let cmd = self.price_command(job, &judged, index, work.path(), &out)?;
        let limits = Limits {
            deadline: Duration::from_secs_f64(t.clock.time_budget + t.deadlines.price_grace),
            disk: None,
        };
        let ended = child::run(cmd, &log, lost, limits)?;
        if overrun(&ended).is_some() {
            return Ok(failed(
                "price:deadline",
                "the pricing ran past the track's deadline and was stopped",
            ));
        }
        let st = match ended {
            Ended::Exited(st) => st,
            _ => unreachable!("an overrun returned above"),
        };
        let res: Value = match std::fs::read(out.join("result.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
        {
            Some(r) => r,
            None => {
                return Ok(failed(
                    "infra:price_error",
                    "the clock wrote no result".to_string(),
                ))
            }
        };
        Ok(priced(&res, st.success(), index))
    }

    /// `fastdecode price` of this job: both sides sandboxed, on the hidden pool's prompt seed
    /// `index`, with the track's window and clock; its result goes to `out`.
    fn price_command(
        &self,
        job: &Job,
        judged: &Judged,
        index: usize,
        work: &Path,
        out: &Path,
    ) -> Result<Command> {
        let t = &job.track;
        let Judged {
            cand,
            base,
            model,
            hidden,
        } = judged;
        let c = &t.clock;
        let w = &t.window;
        // Both sides run in the same sandbox, so a no-op is priced under the same conditions on
        // either side (the trusted baseline gains nothing from it but symmetry: on an H100 one
        // no-op sandboxed against an unsandboxed baseline priced 1.0021 [1.0006, 1.0035], its
        // interval clear of 1.0).
        let mut cmd = Command::new(&self.me);
        cmd.arg("price")
            .arg("--baseline")
            .arg(self.sandboxed(base, model, &work.join("baseline"))?)
            .arg("--candidate")
            .arg(self.sandboxed(cand, model, &work.join("candidate"))?)
            .args(model)
            .args(["--track", &t.clock_track])
            .args(["--seed", &hidden.pool_seeds[index].to_string()])
            .args(["--prompt-tokens", &w.prompt_tokens.to_string()])
            .args(["--decode-tokens", &w.decode_tokens.to_string()])
            .args([
                "--floor",
                &c.floor.to_string(),
                "--target-ci",
                &c.target_ci.to_string(),
            ])
            .args([
                "--min-pairs",
                &c.min_pairs.to_string(),
                "--max-pairs",
                &c.max_pairs.to_string(),
            ])
            .args(["--time-budget", &c.time_budget.to_string()]);
        if t.clock_track == "dflash" {
            cmd.args([
                "--block-size",
                &w.block_size.to_string(),
                "--draft",
                &w.draft,
            ]);
        }
        // The clock's own line (pairs so far, the interval, the time left), outside every
        // sandbox: the candidate cannot write what the heartbeat shows.
        let progress = work.join("progress");
        cmd.args(&c.extra_args)
            .arg("--out")
            .arg(out)
            .arg("--progress-file")
            .arg(&progress);
        self.progress.follow(progress);
        Ok(cmd)
    }
}

/// The stage's outcome from the clock's `result.json` (`res`) and whether `fastdecode price`
/// exited well.
fn priced(res: &Value, success: bool, index: usize) -> Outcome {
    let mut metrics = serde_json::Map::new();
    for k in crate::record::metrics::METRICS.iter().map(|m| m.0) {
        if !res[k].is_null() {
            metrics.insert(k.into(), res[k].clone());
        }
    }
    let verdict = res["verdict"]
        .as_str()
        .unwrap_or("infra:price_error")
        .to_string();
    let score = res["score"]
        .as_f64()
        .map(|s| format!("{s:.4}"))
        .unwrap_or("-".into());
    let ci = match (res["ci95"][0].as_f64(), res["ci95"][1].as_f64()) {
        (Some(a), Some(b)) => format!(" [{a:.4}, {b:.4}]"),
        _ => String::new(),
    };
    let detail = format!(
        "{verdict}: score {score}{ci} over {} pair(s); {}",
        res["pairs_used"],
        spent(&res["spent"])
    );
    // Each pair's own score, for the pairs plot of the submission's page: ratios of
    // timings only (no prompt, token or seed), what the clock's own pairs.svg shows.
    let pairs: Vec<Value> = res["pairs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["score"].is_number())
        .map(|p| {
            json!({
                "score": p["score"],
                "accepted": p["accepted"],
                "candidate_first": p["candidate_first"],
            })
        })
        .collect();
    if success && verdict == "passed" {
        return ok(
            detail,
            json!({"metrics": metrics, "pool_index": index, "pairs": pairs}),
        );
    }
    // The clock's own account stays in the stage's private result, for the operator: what
    // the solver sees of a candidate's failure on the hidden pool is one fixed category.
    Outcome {
        result: json!({
            "verdict": verdict,
            "culprit": res["culprit"],
            "clock_detail": res["detail"],
            "pool_index": index,
        }),
        ..priced_failure(&verdict, res["culprit"].as_str(), detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pricing_failure_of_the_candidate_is_one_category() {
        let d = || "the clock's detail".to_string();
        for v in [
            "infra:worker_crashed",
            "infra:worker_hung",
            "violation:token_count",
            "violation:timed_fidelity_divergence",
            "violation:implausible_speed",
        ] {
            let o = priced_failure(v, Some("candidate"), d());
            assert_eq!(
                (o.outcome.as_str(), o.detail.as_str()),
                (HIDDEN_PROMPT, "on the hidden pool's prompts")
            );
        }
        assert_eq!(
            priced_failure("below_floor", Some("candidate"), d()).outcome,
            "price:below_floor"
        );
        // The trusted side's trouble, or the machine's, keeps its own words and is free.
        assert_eq!(
            priced_failure("infra:worker_crashed", Some("baseline"), d()).outcome,
            "infra:worker_crashed"
        );
        assert_eq!(
            priced_failure("infra:inconclusive", None, d()).outcome,
            "infra:inconclusive"
        );
    }
}
