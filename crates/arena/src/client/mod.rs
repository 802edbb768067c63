//! `fastdecode submit` and `fastdecode arena status`: bundle what the working tree changed on
//! a track's surface against its current base, show it, upload it with an idempotency key,
//! then follow the stages live to the verdict table.
//!
//! This folder is what drives an arena from outside, as a solver does: this module, the demo
//! (`demo`: the whole challenge on one machine, the bundled examples submitted with this
//! module's code) and the red team (`redteam`: the corpus of cheats, run against a real arena).

pub mod demo;
pub mod redteam;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::api::{
    Accepted, LocalMachine, LocalResult, Mode, NewSubmission, SubmissionView, TrackView,
};
use crate::bundle::{self, Content};
use crate::git;
use crate::http::Api;

pub struct SubmitOptions {
    pub server: String,
    pub token: String,
    pub track: String,
    pub note_file: PathBuf,
    pub model: Option<String>,
    pub claimed_score: Option<f64>,
    pub repo: PathBuf,
    pub idempotency_key: Option<String>,
    pub mode: Mode,
    /// A `fastdecode price` result.json to send as the submission's local result.
    pub local_result: Option<PathBuf>,
}

/// The largest result.json `--local-result` reads (a long pricing's windows run to megabytes).
const RESULT_MAX_BYTES: u64 = 64 << 20;

/// The local result of `fastdecode price`'s `result.json` at `path`, for `track`: its score,
/// interval, pairs, clock track and machine, checked (the file and the field named in every
/// error): a score and interval present and finite, the interval holding the score, the track's
/// clock track and window.
pub fn local_result(path: &Path, track: &TrackView) -> Result<LocalResult> {
    let at = format!("--local-result {}", path.display());
    let size = std::fs::metadata(path).with_context(|| at.clone())?.len();
    if size > RESULT_MAX_BYTES {
        bail!("{at}: {size} bytes, more than a result.json of `fastdecode price` ({RESULT_MAX_BYTES} at most)");
    }
    let text = crate::store::read_regular_text(path).with_context(|| at.clone())?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{at}: not JSON (a result.json of `fastdecode price`)"))?;
    if !v.is_object() {
        bail!("{at}: not a result.json of `fastdecode price` (not a JSON object)");
    }
    let number = |field: &str| -> Result<f64> {
        match &v[field] {
            serde_json::Value::Null => bail!(
                "{at}: no {field} (the pricing ended {:?} without one)",
                v["verdict"].as_str().unwrap_or("?")
            ),
            x => x
                .as_f64()
                .filter(|f| f.is_finite())
                .with_context(|| format!("{at}: {field} {x}: not a finite number")),
        }
    };
    let score = number("score")?;
    let ci95 = match v["ci95"].as_array().map(|a| a.as_slice()) {
        Some([lo, hi]) => match (lo.as_f64(), hi.as_f64()) {
            (Some(lo), Some(hi)) if lo.is_finite() && hi.is_finite() => [lo, hi],
            _ => bail!("{at}: ci95 {}: two finite numbers", v["ci95"]),
        },
        None if v["ci95"].is_null() => bail!("{at}: no ci95 (the pricing found no interval)"),
        _ => bail!("{at}: ci95 {}: two finite numbers", v["ci95"]),
    };
    let pairs = v["pairs_used"]
        .as_u64()
        .with_context(|| format!("{at}: pairs_used {}: a whole number", v["pairs_used"]))?;
    let clock_track = v["track"]
        .as_str()
        .with_context(|| format!("{at}: track {}: a clock track's name", v["track"]))?;
    for (field, want) in [
        ("prompt_tokens", track.rules.prompt_tokens),
        ("decode_tokens", track.rules.decode_tokens),
    ] {
        if let Some(got) = v[field].as_u64() {
            if got != want as u64 {
                bail!(
                    "{at}: {field} {got}: track {} prices {want} (price with the track's window)",
                    track.name
                );
            }
        }
    }
    let m = &v["machine"];
    let text_of = |x: &serde_json::Value| x.as_str().map(str::to_string);
    let machine = LocalMachine {
        cpu_model: text_of(&m["cpu_model"]),
        cpus: m["cpus"].as_u64(),
        gpus: m["gpus"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(text_of)
            .collect(),
        backend: text_of(&m["backend"]),
    };
    let local = LocalResult {
        score,
        ci95,
        pairs,
        track: clock_track.to_string(),
        machine,
    };
    local.check(&track.clock_track).map_err(|e| {
        let e = e.replace(
            &format!("track {clock_track:?}: this track"),
            &format!("track {clock_track:?}: track {}", track.name),
        );
        anyhow::anyhow!("{at}: {e}")
    })?;
    Ok(local)
}

fn nul_list(b: &[u8]) -> Vec<String> {
    b.split(|&c| c == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

fn on_surface(globs: &[String], path: &str) -> bool {
    let opts = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: true,
        require_literal_leading_dot: false,
    };
    globs
        .iter()
        .filter_map(|g| glob::Pattern::new(g).ok())
        .any(|p| p.matches_with(path, opts))
}

/// What a working tree changed against a base.
pub struct Changes {
    /// What the bundle carries.
    pub entries: Vec<(String, Content)>,
    /// Changed paths left out because they are off the surface.
    pub off_surface: Vec<String>,
}

/// The bundle of what `repo`'s working tree changed against `base` on `surface`.
pub fn changes(repo: &Path, base: &str, surface: &[String]) -> Result<Changes> {
    git::output(repo, &["cat-file", "-e", &format!("{base}^{{commit}}")]).with_context(|| {
        format!(
            "the track's current base {base} is not in {}: fetch the arena's branch arena-base/<track> first",
            repo.display()
        )
    })?;
    let mut paths = nul_list(&git::output(
        repo,
        &["diff", "--name-only", "--no-renames", "-z", base, "--"],
    )?);
    paths.extend(nul_list(&git::output(
        repo,
        &["ls-files", "--others", "--exclude-standard", "-z"],
    )?));
    paths.sort();
    paths.dedup();
    let (mut entries, mut off) = (vec![], vec![]);
    for p in paths {
        if !on_surface(surface, &p) {
            off.push(p);
            continue;
        }
        let full = repo.join(&p);
        let m = match std::fs::symlink_metadata(&full) {
            Ok(m) => m,
            Err(_) => bail!("{p}: deleted in the working tree; a bundle can change and add files, not delete them"),
        };
        if m.file_type().is_symlink() {
            let t = std::fs::read_link(&full).with_context(|| p.clone())?;
            entries.push((p, Content::Symlink(t.to_string_lossy().into_owned())));
        } else if m.is_file() {
            use std::os::unix::fs::PermissionsExt;
            let data = crate::store::read_regular(&full)?;
            entries.push((p, Content::File(data, m.permissions().mode())));
        } else {
            bail!("{p}: not a regular file");
        }
    }
    Ok(Changes {
        entries,
        off_surface: off,
    })
}

/// Submits and follows; the final view (its status says whether it passed).
pub fn submit(o: &SubmitOptions) -> Result<SubmissionView> {
    let note = crate::store::read_regular_text(&o.note_file)
        .with_context(|| format!("--note-file {}", o.note_file.display()))?;
    if note.trim().is_empty() {
        bail!("--note-file {}: the note is empty", o.note_file.display());
    }
    if let Some(s) = o.claimed_score {
        if !s.is_finite() {
            bail!("--claimed-score {s}: a finite number");
        }
    }
    let api = Api::new(&o.server, Some(&o.token))?;
    let track: TrackView = api.get_json(&format!("/api/tracks/{}", o.track))?;
    let local = o
        .local_result
        .as_deref()
        .map(|p| local_result(p, &track))
        .transpose()?;
    let Changes {
        entries,
        off_surface: off,
    } = changes(&o.repo, &track.current_base, &track.surface)?;
    let bytes = bundle::pack(&entries)?;
    let digest = bundle::digest(&bytes);
    let mut say = String::new();
    say += &format!(
        "track {} (base {}), surface {}\n",
        track.name,
        &track.current_base[..12],
        track.surface.join(", ")
    );
    if entries.is_empty() {
        say += "no changes on the surface: a no-op submission\n";
    }
    for (p, c) in &entries {
        say += &format!("  send  {p} ({})\n", c.describe());
    }
    for p in &off {
        say += &format!("  skip  {p} (off the surface)\n");
    }
    say += &format!("bundle {digest}, {} bytes\n", bytes.len());
    if let Some(l) = &local {
        say += &format!(
            "local result: score {:.4} [{:.4}, {:.4}] in {} pairs on {}\n",
            l.score,
            l.ci95[0],
            l.ci95[1],
            l.pairs,
            l.machine_line()
        );
    }
    eprint!("{say}");
    // The same change, note, base and mode make the same key: re-running after a lost answer
    // is one submission, not two (a leaderboard key is what it was before modes existed).
    let key = o.idempotency_key.clone().unwrap_or_else(|| {
        let mut k = format!("{}|{}|{digest}|{note}", track.name, track.current_base);
        if o.mode != Mode::Leaderboard {
            k += &format!("|{}", o.mode);
        }
        bundle::digest(k.as_bytes())
    });
    let req = NewSubmission {
        track: track.name.clone(),
        note,
        model: o.model.clone(),
        claimed_score: o.claimed_score,
        bundle: crate::api::encode_bundle(&bytes),
        mode: o.mode,
        local_result: local,
    };
    let acc: Accepted = api
        .post("/api/submissions", &req, &[("Idempotency-Key", &key)])?
        .context("the service accepted nothing")?;
    eprintln!(
        "submission {}{} (its page: {}/submissions/{})",
        acc.id,
        if acc.duplicate {
            " (already submitted with this key)"
        } else {
            ""
        },
        o.server.trim_end_matches('/'),
        acc.id
    );
    follow(&api, &acc.id)
}

/// Polls a submission (twice a second) until its verdict, printing each stage as it starts and
/// ends: the same record its page follows.
pub fn follow(api: &Api, id: &str) -> Result<SubmissionView> {
    let mut progress = Progress::default();
    poll(api, id, |v| progress.show(v))
}

/// Polls a submission twice a second, handing each view to `show`, until the submission is
/// finished and `show` says it has shown all of it.
pub fn poll(
    api: &Api,
    id: &str,
    mut show: impl FnMut(&SubmissionView) -> bool,
) -> Result<SubmissionView> {
    loop {
        let v: SubmissionView = api.get_json(&format!("/api/submissions/{id}"))?;
        if show(&v) && v.finished() {
            return Ok(v);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// What `follow` has printed of a submission so far.
#[derive(Default)]
struct Progress {
    /// Stages printed with their outcome.
    shown: usize,
    /// The stage printed as running.
    open: Option<String>,
    /// The queue position printed last.
    last_pos: Option<i64>,
    said: Said,
}

impl Progress {
    /// Prints what is new in `v`; whether every stage of it is printed with its outcome.
    fn show(&mut self, v: &SubmissionView) -> bool {
        if v.queue_position != self.last_pos {
            if let Some(p) = v.queue_position {
                eprintln!("  queued: {p} ahead");
            }
            self.last_pos = v.queue_position;
        }
        while self.shown < v.stages.len() {
            let s = &v.stages[self.shown];
            match &s.outcome {
                Some(out) => {
                    let secs = s.ended_ms.unwrap_or(s.started_ms) - s.started_ms;
                    eprintln!(
                        "  {:<8} {:<10} {:>7.1} s  {}",
                        s.stage,
                        out,
                        secs as f64 / 1000.0,
                        first_line(s.detail.as_deref())
                    );
                    self.shown += 1;
                    self.open = None;
                }
                None => {
                    if self.open.as_deref() != Some(&s.stage) {
                        eprintln!(
                            "  {:<8} running on {}",
                            s.stage,
                            s.runner.as_deref().unwrap_or("?")
                        );
                        self.open = Some(s.stage.clone());
                        self.said = Said::default();
                    }
                    if let Some(p) = s.detail.as_deref().filter(|p| self.said.worth_saying(p)) {
                        eprintln!("  {:<8} {p}", s.stage);
                    }
                    break;
                }
            }
        }
        self.shown == v.stages.len()
    }
}

/// The running stage's progress lines already printed: a line is printed when its words change
/// (`compiling the candidate (41 s)`: the time run aside), or every 15 s while they do not.
#[derive(Default)]
struct Said {
    words: String,
    at: Option<std::time::Instant>,
}

impl Said {
    fn worth_saying(&mut self, line: &str) -> bool {
        let words = line.rsplit_once(" (").map_or(line, |(w, _)| w);
        let due = self
            .at
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(15));
        if words == self.words && !due {
            return false;
        }
        self.words = words.to_string();
        self.at = Some(std::time::Instant::now());
        true
    }
}

/// A detail's first line (the rest is on the submission's page); none is an empty line.
fn first_line(detail: Option<&str>) -> &str {
    detail.unwrap_or("").lines().next().unwrap_or("")
}

/// Whether a final status counts as passed.
pub fn passed(v: &SubmissionView) -> bool {
    matches!(
        v.status.as_str(),
        "held" | "promoted" | "repriced" | "tested" | "benchmarked" | "profiled"
    )
}

/// The verdict table.
pub fn table(v: &SubmissionView) -> String {
    let mut t = String::new();
    let row = |t: &mut String, k: &str, val: String| *t += &format!("{k:<36} {val}\n");
    row(&mut t, "submission", v.id.clone());
    row(
        &mut t,
        "track",
        format!(
            "{} (base {})",
            v.track,
            &v.base_commit[..12.min(v.base_commit.len())]
        ),
    );
    row(&mut t, "solver", v.solver.clone());
    if let Some(r) = &v.reprice_of {
        row(&mut t, "re-pricing of", r.clone());
    }
    if v.mode != Mode::Leaderboard {
        row(
            &mut t,
            "mode",
            format!("{} (private: only you see it)", v.mode),
        );
    }
    row(&mut t, "status", v.status.clone());
    if let Some(verdict) = &v.verdict {
        if let Some(c) = verdict["category"].as_str() {
            row(&mut t, "category", c.to_string());
            row(
                &mut t,
                "stage",
                verdict["stage"].as_str().unwrap_or("").to_string(),
            );
            row(
                &mut t,
                "detail",
                first_line(verdict["detail"].as_str()).to_string(),
            );
        }
        if let Some(m) = verdict["metrics"].as_object() {
            for (k, val) in m {
                row(&mut t, k, crate::record::metrics::text(val));
            }
        }
        if let Some(w) = verdict["not_promoted"].as_str() {
            row(&mut t, "not promoted", w.to_string());
        }
        if let Some(b) = verdict["base_commit"].as_str() {
            row(&mut t, "new base", b.to_string());
        }
    }
    // A profile run's profile: names in the safe charset the service keeps (no escapes reach
    // the terminal).
    if let Some(p) = &v.profile {
        t += &p.table();
    }
    t
}

pub fn status(server: &str, token: Option<&str>, id: &str, json: bool) -> Result<bool> {
    let api = Api::new(server, token)?;
    let v: SubmissionView = api.get_json(&format!("/api/submissions/{id}"))?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        for s in &v.stages {
            let secs = s
                .ended_ms
                .map(|e| format!("{:.1} s", (e - s.started_ms) as f64 / 1000.0))
                .unwrap_or("running".into());
            outln!(
                "{:<8} {:<22} {:<10} {:>9}  {}",
                s.stage,
                s.runner.as_deref().unwrap_or("service"),
                s.outcome.as_deref().unwrap_or("-"),
                secs,
                first_line(s.detail.as_deref())
            )?;
        }
        if let Some(p) = v.queue_position {
            outln!("queued: {p} ahead")?;
        }
        out!("{}", table(&v))?;
    }
    Ok(passed(&v))
}

#[cfg(test)]
mod tests {
    use super::Said;
    use crate::api::{Rules, TrackView};

    fn track() -> TrackView {
        TrackView {
            name: "serial-tiny".into(),
            description: String::new(),
            runner_kind: "cpu".into(),
            clock_track: "serial".into(),
            surface: vec![],
            baseline: String::new(),
            current_base: String::new(),
            baseline_score: 1.0,
            current_best_score: 1.0,
            current_best_metrics: None,
            publish_code: "always".into(),
            rules: Rules {
                prompt_tokens: 32,
                decode_tokens: 32,
                block_size: None,
                floor: 0.5,
                target_ci: 0.03,
                min_pairs: 10,
                max_pairs: 40,
                promotion_margin: 0.01,
            },
            leaderboard: vec![],
            frontier: vec![],
            queue: vec![],
        }
    }

    /// A result.json as `fastdecode price` writes it (the fields the ledger reads, and others).
    fn result() -> serde_json::Value {
        serde_json::json!({
            "verdict": "passed", "passed": true, "track": "serial", "score": 1.21,
            "ci95": [1.18, 1.24], "half_width": 0.025, "pairs_used": 12,
            "prompt_tokens": 32, "decode_tokens": 32, "gpu_telemetry": false,
            "machine": {"cpu_model": "AMD EPYC 7B13", "cpus": 2, "gpus": [], "backend": "cpu"},
            "pairs": [],
        })
    }

    /// `local_result` of `v` written to a file: the result or the error's text.
    fn read(v: &serde_json::Value) -> Result<crate::api::LocalResult, String> {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("result.json");
        std::fs::write(&f, v.to_string()).unwrap();
        super::local_result(&f, &track()).map_err(|e| format!("{e:#}"))
    }

    #[test]
    fn a_price_result_becomes_a_compact_local_result() {
        let l = read(&result()).unwrap();
        assert_eq!((l.score, l.ci95, l.pairs), (1.21, [1.18, 1.24], 12));
        assert_eq!(l.track, "serial");
        assert_eq!(l.machine_line(), "AMD EPYC 7B13, 2 CPUs, cpu");
        // Without a machine (a result.json from before it had one): an undescribed machine.
        let mut v = result();
        v.as_object_mut().unwrap().remove("machine");
        assert_eq!(read(&v).unwrap().machine_line(), "an undescribed machine");
    }

    #[test]
    fn a_bad_local_result_is_refused_naming_the_file_and_the_field() {
        let cases: Vec<(&str, serde_json::Value, &str)> = vec![
            (
                "score",
                serde_json::Value::Null,
                "no score (the pricing ended \"passed\"",
            ),
            (
                "score",
                "fast".into(),
                "score \"fast\": not a finite number",
            ),
            ("score", (-1.0).into(), "score -1: a finite number above 0"),
            ("ci95", serde_json::Value::Null, "no ci95"),
            (
                "ci95",
                serde_json::json!([1.0]),
                "ci95 [1.0]: two finite numbers",
            ),
            (
                "ci95",
                serde_json::json!([1.3, 1.4]),
                "ci95 [1.3, 1.4]: does not hold the score 1.21",
            ),
            (
                "pairs_used",
                serde_json::Value::Null,
                "pairs_used null: a whole number",
            ),
            (
                "track",
                "dflash".into(),
                "track \"dflash\": track serial-tiny is priced on the serial clock track",
            ),
            (
                "decode_tokens",
                256.into(),
                "decode_tokens 256: track serial-tiny prices 32",
            ),
            (
                "machine",
                serde_json::json!({"cpu_model": "x".repeat(201)}),
                "machine.cpu_model: at most 200 characters",
            ),
            (
                "machine",
                serde_json::json!({"backend": "cpu\u{1b}[31m"}),
                "machine.backend: at most 200 characters, none of them control characters",
            ),
        ];
        for (field, value, want) in cases {
            let mut v = result();
            v[field] = value;
            let e = read(&v).unwrap_err();
            assert!(
                e.starts_with("--local-result ") && e.contains("result.json: ") && e.contains(want),
                "{field}: {e}"
            );
        }
        for (text, want) in [("[1, 2]", "not a JSON object"), ("{", "not JSON")] {
            let d = tempfile::tempdir().unwrap();
            let f = d.path().join("result.json");
            std::fs::write(&f, text).unwrap();
            let e = format!("{:#}", super::local_result(&f, &track()).unwrap_err());
            assert!(e.contains("result.json: ") && e.contains(want), "{e}");
        }
        let e = format!(
            "{:#}",
            super::local_result(std::path::Path::new("/nonexistent/result.json"), &track())
                .unwrap_err()
        );
        assert!(
            e.starts_with("--local-result /nonexistent/result.json"),
            "{e}"
        );
    }

    #[test]
    fn a_progress_line_is_said_when_its_words_change_not_its_time() {
        let mut said = Said::default();
        assert!(said.worth_saying("compiling the candidate (5 s)"));
        assert!(!said.worth_saying("compiling the candidate (10 s)"));
        assert!(said.worth_saying("2 of at most 30 pairs; pair 3 Baseline (15 s)"));
        assert!(!said.worth_saying("2 of at most 30 pairs; pair 3 Baseline (20 s)"));
        // Words unchanged for 15 s are said again, so a long phase still shows it is alive.
        said.at = Some(std::time::Instant::now() - std::time::Duration::from_secs(16));
        assert!(said.worth_saying("2 of at most 30 pairs; pair 3 Baseline (31 s)"));
    }
}
