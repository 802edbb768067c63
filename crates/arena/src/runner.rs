//! The runner (`fastdecode arena runner`): the trusted parent on a build or timing machine. It
//! leases one job at a time, heartbeats while it works, runs the stage and reports it; the
//! candidate only ever runs as a child of `fastdecode gate` and `fastdecode price`, which this
//! binary drives as they are. Every child dies with the runner (`PR_SET_PDEATHSIG`), so a
//! killed runner leaves no worker behind: its lease expires and another runner resumes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::api::{BuildRecord, Heartbeat, Job, LeaseRequest, Report, ReportReply};
use crate::bundle::{self, digest};
use crate::http::Api;
use crate::policy;
use crate::review::{self, External};
use crate::sandbox::Sandbox;
use crate::stages;
use crate::store::write_atomic;
use crate::track::{Hidden, Track};
use crate::{builder, track};

pub struct Options {
    pub server: String,
    pub token: String,
    pub kind: String,
    pub cache: PathBuf,
    pub reviewer: Option<String>,
    pub poll: Duration,
}

/// How one stage ended: `ok` or a category, the public detail, the private result.
struct Outcome {
    outcome: String,
    detail: String,
    result: Value,
}

fn ok(detail: impl Into<String>, result: Value) -> Outcome {
    Outcome {
        outcome: "ok".into(),
        detail: detail.into(),
        result,
    }
}

fn failed(category: impl Into<String>, detail: impl Into<String>) -> Outcome {
    Outcome {
        outcome: category.into(),
        detail: detail.into(),
        result: Value::Null,
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
}

/// Runs `cmd`, its output to `log`, dying with this process; killed (and an error) when
/// `lost` is set (the lease went to another runner).
fn run_child(mut cmd: Command, log: &Path, lost: &AtomicBool) -> Result<std::process::ExitStatus> {
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
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok(st);
        }
        if lost.load(Ordering::Acquire) {
            // SAFETY: signalling the process group this child leads.
            unsafe {
                libc::kill(-(child.id() as i32), libc::SIGKILL);
            }
            let _ = child.wait();
            bail!("the lease was lost; the stage was stopped");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn tail(log: &Path, lines: usize) -> String {
    let t = std::fs::read_to_string(log).unwrap_or_default();
    let v: Vec<&str> = t.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
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

    /// An artifact's bytes' local copy, fetched once and checked against its digest.
    fn artifact(&self, d: &str, executable: bool) -> Result<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        let p = self.dir("artifacts")?.join(d.replacen(':', "-", 1));
        if !p.is_file() {
            let bytes = self
                .api
                .get_bytes(&format!("/api/artifacts/{d}"))?
                .with_context(|| format!("the service has no artifact {d}"))?;
            if digest(&bytes) != d {
                bail!("artifact {d}: the service sent other bytes");
            }
            write_atomic(&p, &bytes)?;
        }
        let mode = if executable { 0o755 } else { 0o644 };
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))?;
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
            stages::GATE => self.gate(job, lost),
            stages::PRICE | stages::CONFIRM => self.price(job, lost),
            s => bail!("a stage this runner does not know: {s}"),
        }
    }

    fn policy(&self, job: &Job) -> Result<Outcome> {
        let tree = self.tree(&job.base_commit)?;
        let bytes = std::fs::read(self.artifact(&job.bundle_digest, false)?)?;
        let entries = match bundle::read(&bytes, job.track.caps.total_bytes) {
            Ok(e) => e,
            Err(e) => return Ok(failed("policy:malformed", format!("{e:#}"))),
        };
        let size = |p: &str| {
            std::fs::symlink_metadata(tree.join(p))
                .ok()
                .filter(|m| m.is_file())
                .map(|m| m.len())
        };
        Ok(match policy::check(&job.track, &entries, &size) {
            Ok(files) => {
                let bytes: usize = files.iter().map(|f| f.data.len()).sum();
                let names: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
                ok(
                    format!(
                        "{} file(s), {bytes} bytes: {}",
                        files.len(),
                        names.join(", ")
                    ),
                    json!({"files": names}),
                )
            }
            Err(f) => failed(f.category, f.detail),
        })
    }

    fn review(&self, job: &Job) -> Result<Outcome> {
        let tree = self.tree(&job.base_commit)?;
        let mut changes = vec![];
        for (p, data, _) in self.bundle_files(job)? {
            let old = std::fs::read(tree.join(&p)).unwrap_or_default();
            changes.push((
                p,
                String::from_utf8_lossy(&old).into_owned(),
                String::from_utf8_lossy(&data).into_owned(),
            ));
        }
        if let Some((rule, detail)) = review::builtin(&changes) {
            return Ok(failed(format!("review:{rule}"), detail));
        }
        let mut said = "built-in rules: no finding".to_string();
        if let Some(cmd) = &self.opts.reviewer {
            let mut text = String::new();
            for (p, old, new) in &changes {
                text += &format!("--- {p}\n");
                for l in review::added_lines(old, new) {
                    text += &format!("+{l}\n");
                }
            }
            match review::external(cmd, &text, Duration::from_secs(600)) {
                External::Approved => said += "; reviewer: approved",
                External::Finding(why) => return Ok(failed("review:reviewer", why)),
                External::Unavailable(why) => {
                    return Ok(failed("infra:review_unavailable", why));
                }
            }
        }
        Ok(ok(said, Value::Null))
    }

    /// The binary of `commit` + `files`: from the service's cache, from this runner's own
    /// earlier build of the same inputs, or built here now.
    fn built(
        &self,
        commit: &str,
        files: &[(String, Vec<u8>, u32)],
        recipe: &track::Build,
        lost: &AtomicBool,
    ) -> Result<std::result::Result<(BuildRecord, String), String>> {
        let key = builder::key(commit, files, recipe);
        if let Some(b) = self.api.get_bytes(&format!("/api/builds/{key}"))? {
            let rec: BuildRecord = serde_json::from_slice(&b)?;
            return Ok(Ok((rec, "cached".into())));
        }
        let root = self.dir("build")?;
        let _lock = builder::Lock::take(&root.join("lock"))?;
        // The same inputs built before by this runner (for another submission, or for another
        // service: the pinned baseline recurs in every one): its artifact is kept here by digest,
        // checked, and sent to the service instead of building again (a release build of the
        // workspace's crates is tens of seconds even when only one file moved since the last).
        let index = self.dir("built")?.join(key.replacen(':', "-", 1));
        if let Ok(d) = std::fs::read_to_string(&index) {
            let d = d.trim();
            let p = self.dir("artifacts")?.join(d.replacen(':', "-", 1));
            if let Ok(bin) = std::fs::read(&p) {
                if digest(&bin) == d {
                    self.api.put_bytes(&format!("/api/artifacts/{d}"), bin)?;
                    let rec = BuildRecord {
                        build_key: key,
                        artifact: d.to_string(),
                    };
                    return Ok(Ok((rec, "built before by this runner".into())));
                }
            }
        }
        let tree = self.tree(commit)?;
        let src = root.join("src");
        builder::sync(&tree, files, &src)?;
        let t0 = Instant::now();
        let log = root.join("build.log");
        let target = root.join("target");
        std::fs::create_dir_all(&target)?;
        // Offline twice over: cargo is told so, and the sandbox has no network.
        let mut cmd = self.sandbox.cargo(
            &[&src, &target],
            &[
                ("CARGO_TARGET_DIR", target.as_path()),
                ("CARGO_NET_OFFLINE", Path::new("true")),
            ],
        )?;
        cmd.args(&recipe.cargo_args);
        let st = run_child(cmd, &log, lost)?;
        if !st.success() {
            let t: Vec<String> = tail(&log, 60)
                .lines()
                .filter(|l| !l.trim_start().starts_with("Compiling"))
                .map(str::to_string)
                .collect();
            return Ok(Err(t[t.len().saturating_sub(30)..].join("\n")));
        }
        let bin = std::fs::read(root.join("target").join(&recipe.binary))
            .context("the build's binary")?;
        let d = digest(&bin);
        self.api
            .put_bytes(&format!("/api/artifacts/{d}"), bin.clone())?;
        write_atomic(&self.dir("artifacts")?.join(d.replacen(':', "-", 1)), &bin)?;
        write_atomic(&index, d.as_bytes())?;
        Ok(Ok((
            BuildRecord {
                build_key: key,
                artifact: d,
            },
            format!("built in {:.0} s", t0.elapsed().as_secs_f64()),
        )))
    }

    fn build(&self, job: &Job, lost: &AtomicBool) -> Result<Outcome> {
        let files = self.bundle_files(job)?;
        let recipe = &job.track.build;
        let cand = match self.built(&job.base_commit, &files, recipe, lost)? {
            Ok(c) => c,
            Err(log) => return Ok(failed("build:failed", log)),
        };
        let same = builder::key(&job.track.baseline, &[], recipe) == cand.0.build_key;
        let base = match if same {
            Ok((cand.0.clone(), "the same build".into()))
        } else {
            self.built(&job.track.baseline, &[], recipe, lost)?
        } {
            Ok(b) => b,
            Err(log) => {
                return Ok(failed(
                    "infra:baseline_build_failed",
                    format!("the pinned baseline does not build:\n{log}"),
                ))
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
                let st = run_child(c, &log, lost)?;
                let out = std::fs::read_to_string(&log).unwrap_or_default();
                let got = out
                    .lines()
                    .find_map(|l| l.strip_prefix("digest "))
                    .map(str::trim);
                if !st.success() || got != t.model.digest.as_deref() {
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

    /// Goldens made by the pinned baseline from `seed`, once, in a directory only this runner
    /// reads (hidden ones never leave it).
    fn goldens(
        &self,
        t: &Track,
        baseline: &Path,
        model: &[String],
        (name, seed, count): (&str, u64, usize),
        lost: &AtomicBool,
    ) -> Result<std::result::Result<PathBuf, String>> {
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
        if !run_child(c, &log, lost)?.success() {
            return Ok(Err(tail(&log, 5)));
        }
        Ok(Ok(dir))
    }

    /// The candidate as `gate` and `price` start it: a wrapper that runs it in the sandbox,
    /// seeing the model (the `--model` of `model`) and nothing else of this machine.
    fn sandboxed(&self, candidate: &Path, model: &[String], work: &Path) -> Result<PathBuf> {
        let dir = model
            .iter()
            .position(|a| a == "--model")
            .and_then(|i| model.get(i + 1))
            .map(PathBuf::from);
        let ro: Vec<&Path> = dir.iter().map(PathBuf::as_path).collect();
        self.sandbox
            .wrapper(candidate, &ro, &work.join("candidate"))
    }

    /// The candidate and pinned baseline binaries the build stage made, as the gate and the
    /// pricing run them.
    fn binaries(&self, job: &Job) -> Result<(PathBuf, PathBuf)> {
        let (cand, base) = built_binaries(job)?;
        Ok((self.artifact(cand, true)?, self.artifact(base, true)?))
    }

    fn gate(&self, job: &Job, lost: &AtomicBool) -> Result<Outcome> {
        let t = &job.track;
        let (cand, base) = self.binaries(job)?;
        let model = match self.model_args(t, lost)? {
            Ok(m) => m,
            Err(o) => return Ok(o),
        };
        let hidden = self.hidden(t)?;
        let mut counts = BTreeMap::new();
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
            let dir = match self.goldens(t, &base, &model, (name, seed, count), lost)? {
                Ok(d) => d,
                Err(log) => {
                    // The pinned baseline itself could not make them: the operator's problem.
                    let detail = if public {
                        log
                    } else {
                        "making the hidden goldens failed".into()
                    };
                    return Ok(failed("infra:golden_make", detail));
                }
            };
            let work = tempfile::tempdir_in(self.dir("work")?)?;
            let report = work.path().join("gate.json");
            let log = work.path().join("gate.log");
            let mut c = Command::new(&self.me);
            c.arg("gate")
                .arg("--reference")
                .arg(&base)
                .arg("--candidate")
                .arg(self.sandboxed(&cand, &model, work.path())?)
                .arg("--golden")
                .arg(&dir)
                .args(&model)
                .args(["--block-size", &t.goldens.block_size.to_string()])
                .arg("--json")
                .arg(&report);
            let st = run_child(c, &log, lost)?;
            let rep: Value = match std::fs::read(&report)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
            {
                Some(r) => r,
                None => {
                    let detail = if public {
                        tail(&log, 5)
                    } else {
                        "the gate wrote no report".into()
                    };
                    return Ok(failed("infra:gate_error", detail));
                }
            };
            if !st.success() || rep["passed"] != json!(true) {
                let f = &rep["failure"];
                let cat = f["category"].as_str().unwrap_or("unknown").to_string();
                let cat = if cat.starts_with("infra:") || cat.starts_with("violation:") {
                    cat
                } else {
                    format!("gate:{cat}")
                };
                let mut detail = format!(
                    "in {}",
                    if public {
                        "the public golden"
                    } else {
                        "a hidden golden"
                    }
                );
                if let Some(s) = f["step"].as_u64() {
                    detail += &format!(" at {}", bucket(s));
                }
                if let Some(side) = f["side"].as_str() {
                    detail += &format!(" ({side})");
                }
                // A worker's own words are public only on public goldens: on hidden ones a
                // candidate could print what it was fed.
                if let (true, Some(d)) = (public, f["detail"].as_str()) {
                    detail += &format!(": {d}");
                }
                return Ok(failed(cat, detail));
            }
            counts.insert(
                name,
                json!({"replay": rep["replay"], "fidelity": rep["fidelity"], "goldens": count}),
            );
        }
        Ok(ok(
            format!(
                "public golden and {} hidden golden(s): exact (within the near-tie budget)",
                t.goldens.hidden_count
            ),
            json!(counts),
        ))
    }

    fn price(&self, job: &Job, lost: &AtomicBool) -> Result<Outcome> {
        let t = &job.track;
        let (cand, base) = self.binaries(job)?;
        let model = match self.model_args(t, lost)? {
            Ok(m) => m,
            Err(o) => return Ok(o),
        };
        let hidden = self.hidden(t)?;
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
        let c = &t.clock;
        let w = &t.window;
        let mut cmd = Command::new(&self.me);
        cmd.arg("price")
            .arg("--baseline")
            .arg(&base)
            .arg("--candidate")
            .arg(self.sandboxed(&cand, &model, work.path())?)
            .args(&model)
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
        cmd.args(&c.extra_args).arg("--out").arg(&out);
        let st = run_child(cmd, &log, lost)?;
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
        let mut metrics = serde_json::Map::new();
        for k in [
            "score",
            "ci95",
            "half_width",
            "floor",
            "stopping_reason",
            "pairs_used",
            "accepted_pair_count",
            "attempted_pair_count",
            "elapsed_seconds",
            "ratio_of_means",
            "decode_ratio_of_means",
            "prefill_ratio_of_means",
            "raw_ratio_of_means",
            "noop_reference",
            "median",
            "min",
            "baseline_seconds_per_token",
            "candidate_seconds_per_token",
            "noop_seconds_per_token",
            "baseline_prefill_seconds_per_token",
            "candidate_prefill_seconds_per_token",
            "prompt_tokens",
            "decode_tokens",
            "block_size",
            "robust_statistic",
            "ci_method",
        ] {
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
            "{verdict}: score {score}{ci} over {} pair(s)",
            res["pairs_used"]
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
        if st.success() && verdict == "passed" {
            return Ok(ok(
                detail,
                json!({"metrics": metrics, "pool_index": index, "pairs": pairs}),
            ));
        }
        let cat = if verdict.starts_with("infra:") || verdict.starts_with("violation:") {
            verdict
        } else {
            format!("price:{verdict}")
        };
        Ok(failed(cat, detail))
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
    let api = Api::new(&opts.server, Some(&opts.token))?;
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
            let beat = {
                let (lost, done) = (lost.clone(), done.clone());
                let api = Api::new(&r.opts.server, Some(&r.opts.token))?;
                let hb = Heartbeat {
                    submission: job.submission.clone(),
                    lease_id: job.lease_id.clone(),
                };
                let every = Duration::from_secs((job.lease_seconds / 3).max(1));
                std::thread::spawn(move || {
                    let mut last = Instant::now();
                    while !done.load(Ordering::Acquire) {
                        std::thread::sleep(Duration::from_millis(100));
                        if last.elapsed() < every {
                            continue;
                        }
                        last = Instant::now();
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
                candidate_caused: false,
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
            results: BTreeMap::new(),
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
