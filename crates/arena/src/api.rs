//! The JSON the service, runners and clients exchange (the HTTP API's bodies).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::track::Track;

/// `POST /api/submissions` (with `Authorization: Bearer <solver token>` and `Idempotency-Key`).
#[derive(Debug, Serialize, Deserialize)]
pub struct NewSubmission {
    pub track: String,
    pub note: String,
    pub model: Option<String>,
    pub claimed_score: Option<f64>,
    /// The gzip tar of changed files, base64.
    pub bundle: String,
    /// What the run is for (`leaderboard` when absent, as before modes existed).
    #[serde(default)]
    pub mode: Mode,
    /// The solver's own pricing of the change (`submit --local-result result.json`), kept
    /// beside the arena's for the transfer ledger; never read to decide anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_result: Option<LocalResult>,
}

/// A solver's local measurement of a change (`fastdecode price`'s `result.json`, compacted by
/// `submit --local-result`): the score it found, its interval, on what machine. Solver-supplied:
/// the record keeps it as data beside the ranked score (issue 49's transfer ledger), pages
/// escape its strings, and nothing that ranks, promotes or prices reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalResult {
    /// The local score (speed-up over the pinned baseline).
    pub score: f64,
    /// Its 95 % interval; holds `score`.
    pub ci95: [f64; 2],
    /// The pairs the pricing used.
    pub pairs: u64,
    /// The clock track it was priced on (`serial`, `dflash`): the arena track's `clock_track`.
    pub track: String,
    #[serde(default)]
    pub machine: LocalMachine,
}

/// The machine of a local pricing, as its `result.json` described it (what it did not is
/// absent).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalMachine {
    #[serde(default)]
    pub cpu_model: Option<String>,
    #[serde(default)]
    pub cpus: Option<u64>,
    #[serde(default)]
    pub gpus: Vec<String>,
    #[serde(default)]
    pub backend: Option<String>,
}

/// The most characters a string of a local result's machine may have.
pub const LOCAL_TEXT_MAX: usize = 200;
/// The most GPUs a local result's machine may list.
pub const LOCAL_GPUS_MAX: usize = 16;

impl LocalResult {
    /// Whether it is a local result the record can keep for a track measured by `clock_track`:
    /// finite numbers, a positive score inside its interval, the same clock track, bounded
    /// strings. The error names the field (`local_result.FIELD` as the API reads it).
    pub fn check(&self, clock_track: &str) -> Result<(), String> {
        let [lo, hi] = self.ci95;
        if !(self.score.is_finite() && self.score > 0.0) {
            return Err(format!("score {}: a finite number above 0", self.score));
        }
        if !(lo.is_finite() && hi.is_finite()) {
            return Err(format!("ci95 [{lo}, {hi}]: finite numbers"));
        }
        if !(lo <= self.score && self.score <= hi) {
            return Err(format!(
                "ci95 [{lo}, {hi}]: does not hold the score {}",
                self.score
            ));
        }
        if self.pairs == 0 || self.pairs > 1_000_000 {
            return Err(format!("pairs {}: from 1 to 1000000", self.pairs));
        }
        if self.track != clock_track {
            return Err(format!(
                "track {:?}: this track is priced on the {clock_track} clock track",
                self.track
            ));
        }
        let m = &self.machine;
        if m.gpus.len() > LOCAL_GPUS_MAX {
            return Err(format!(
                "machine.gpus: {} names, at most {LOCAL_GPUS_MAX}",
                m.gpus.len()
            ));
        }
        let texts = [
            ("machine.cpu_model", m.cpu_model.as_deref()),
            ("machine.backend", m.backend.as_deref()),
        ]
        .into_iter()
        .chain(m.gpus.iter().map(|g| ("machine.gpus", Some(g.as_str()))));
        for (field, t) in texts {
            let Some(t) = t else { continue };
            if t.chars().count() > LOCAL_TEXT_MAX || t.chars().any(char::is_control) {
                return Err(format!(
                    "{field}: at most {LOCAL_TEXT_MAX} characters, none of them control characters"
                ));
            }
        }
        if m.cpus.is_some_and(|c| c == 0 || c > 1_000_000) {
            return Err("machine.cpus: from 1 to 1000000".into());
        }
        Ok(())
    }

    /// The machine in one line (`AMD EPYC 7B13, 2 CPUs, NVIDIA H100, cuda`; `an undescribed
    /// machine` when the result named none of it). Unescaped: a page escapes it.
    pub fn machine_line(&self) -> String {
        let m = &self.machine;
        let mut parts: Vec<String> = vec![];
        parts.extend(m.cpu_model.clone());
        parts.extend(m.cpus.map(|c| format!("{c} CPUs")));
        parts.extend(m.gpus.iter().cloned());
        parts.extend(m.backend.clone());
        if parts.is_empty() {
            "an undescribed machine".into()
        } else {
            parts.join(", ")
        }
    }
}

/// What a submission is for (issue 49). Every mode runs the same policy, review, build and gate
/// in the same sandbox under the same size caps; they differ in where the pipeline ends, who
/// may see the result and which daily allowance it draws on.
///
/// - `test`: ends after the gate (public and hidden goldens) with the status `tested`; nothing
///   is priced.
/// - `benchmark`: then a pricing against the current base, ending `benchmarked` with its score;
///   never confirmed, promoted, re-priced or ranked.
/// - `profile`: a `benchmark`, then a profile of the candidate on the same kind of runner
///   (`crate::profile`: its per-op times; on a CUDA track its per-kernel timeline too), ending
///   `profiled`; the profile is its solver's only and nothing that ranks reads it.
/// - `leaderboard`: the public submission, ranked and promoted as it earns.
///
/// `test`, `benchmark` and `profile` are private runs: only their solver (with its token) sees
/// them, they draw on the track's `caps.private_runs_per_day` instead of its failure cap, and
/// runners lease them after every waiting leaderboard job of their kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Test,
    Benchmark,
    Profile,
    #[default]
    Leaderboard,
}

impl Mode {
    /// As the database and the API write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Test => "test",
            Mode::Benchmark => "benchmark",
            Mode::Profile => "profile",
            Mode::Leaderboard => "leaderboard",
        }
    }

    /// From the database's column; anything else is a damaged row.
    pub fn parse(s: &str) -> Option<Mode> {
        [
            Mode::Test,
            Mode::Benchmark,
            Mode::Profile,
            Mode::Leaderboard,
        ]
        .into_iter()
        .find(|m| m.as_str() == s)
    }

    /// A run only its solver sees (`test`, `benchmark`, `profile`).
    pub fn private(self) -> bool {
        self != Mode::Leaderboard
    }
}

/// Read by name, an unknown one refused naming the field and the modes there are.
impl<'de> Deserialize<'de> for Mode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Mode, D::Error> {
        let s = String::deserialize(d)?;
        Mode::parse(&s).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "mode {s:?}: one of test, benchmark, profile, leaderboard"
            ))
        })
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Accepted {
    pub id: String,
    /// True when the idempotency key had been used: this is the earlier submission.
    pub duplicate: bool,
}

/// One attempt at a stage, as the public sees it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StageView {
    pub stage: String,
    pub runner: Option<String>,
    pub started_ms: i64,
    pub ended_ms: Option<i64>,
    pub outcome: Option<String>,
    pub detail: Option<String>,
}

/// `GET /api/submissions/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubmissionView {
    pub id: String,
    pub solver: String,
    pub track: String,
    pub model: Option<String>,
    pub claimed_score: Option<f64>,
    pub note: String,
    pub base_commit: String,
    pub reprice_of: Option<String>,
    /// The submission that re-prices this one on a newer base.
    pub repriced_as: Option<String>,
    pub created_ms: i64,
    /// `test`, `benchmark`, `profile` or `leaderboard` (`Mode`).
    #[serde(default)]
    pub mode: Mode,
    /// `queued`, `running`, `held` (passed, not promoted), `promoted`, `repriced` (held, then
    /// re-priced on a newer base as another submission), `failed`; a private run ends
    /// `tested` (a test that passed the gate), `benchmarked` (a benchmark priced) or
    /// `profiled` (a profile run priced and profiled).
    pub status: String,
    /// Why an operator marked it as a cheat (it is then out of the ranking; its record stays).
    pub cheat: Option<String>,
    /// Submissions ahead of this one for the same kind of runner (while queued).
    pub queue_position: Option<i64>,
    pub next_stage: Option<String>,
    pub verdict: Option<serde_json::Value>,
    pub stages: Vec<StageView>,
    /// Every pricing of this change: the first, then its re-pricings on later bases (each its
    /// own submission), oldest first; earlier measurements are kept as they were.
    pub pricings: Vec<PricingRow>,
    /// The pairs of its pricing (what the first pairs plot draws, with the verdict's score).
    pub pairs: Vec<PairPoint>,
    /// The pairs of its confirmation pricing, when it had one (the second plot, with the
    /// confirmation's own score).
    pub confirmation_pairs: Vec<PairPoint>,
    /// The change as a unified diff against its base, where the track publishes code
    /// (`publish_code`: `always`, or `after_promotion` once it is promoted).
    pub code: Option<String>,
    /// The solver's own pricing sent with it (`submit --local-result`), kept as sent.
    #[serde(default)]
    pub local_result: Option<LocalResult>,
    /// A profile run's profile, once profiled (its solver's only, as the whole view is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<crate::profile::Profile>,
}

impl SubmissionView {
    pub fn finished(&self) -> bool {
        self.next_stage.is_none()
    }
}

/// One pricing of a change: the submission that made it, on which base, with what result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PricingRow {
    pub submission: String,
    pub base_commit: String,
    pub status: String,
    pub score: Option<f64>,
    pub ci95: Option<[f64; 2]>,
    pub created_ms: i64,
}

/// One pair of a pricing: its own score (candidate over baseline), whether the clock accepted
/// it, and whether the candidate ran first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PairPoint {
    pub score: f64,
    pub accepted: bool,
    pub candidate_first: bool,
}

/// `GET /api/submissions`: one page of submissions, newest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubmissionList {
    pub submissions: Vec<SubmissionSummary>,
    pub page: u64,
    pub per_page: u64,
    /// How many match the filters, over all pages.
    pub total: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubmissionSummary {
    pub id: String,
    pub solver: String,
    pub track: String,
    pub model: Option<String>,
    /// `test`, `benchmark`, `profile` or `leaderboard` (only its solver lists the private ones).
    #[serde(default)]
    pub mode: Mode,
    pub status: String,
    /// A failed one's category (`gate:fidelity_divergence`, `policy:off_surface`, …).
    pub category: Option<String>,
    pub cheat: Option<String>,
    pub score: Option<f64>,
    pub reprice_of: Option<String>,
    pub created_ms: i64,
    /// The solver's own pricing sent with it, if any.
    #[serde(default)]
    pub local_result: Option<LocalResult>,
}

/// `GET /api/tracks/{name}/ledger`: the transfer ledger (issue 49). Each public (leaderboard)
/// submission that carried its solver's local pricing and was priced by the arena, not marked a
/// cheat, oldest first: what the solver's machine said beside what the arena's runner measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ledger {
    pub track: String,
    pub rows: Vec<LedgerRow>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LedgerRow {
    pub submission: String,
    pub solver: String,
    pub track: String,
    /// `leaderboard`; in a solver's own ledger (with its token), `benchmark` or `profile` too.
    pub mode: Mode,
    /// The solver's pricing (score, interval, pairs, machine), as sent.
    pub local: LocalResult,
    /// The arena's pricing: the verdict's score and interval.
    pub ranked_score: f64,
    pub ranked_ci95: Option<[f64; 2]>,
    /// The submission's status (`held`, `promoted`, `repriced`, `failed`, …).
    pub status: String,
    pub created_ms: i64,
}

/// `GET /api/solvers/{name}/ledger`: one solver's transfer ledger over every track, oldest
/// first, and how far each of its local machines sat from the arena. The public's holds its
/// leaderboard submissions (as the tracks' ledgers do); the solver's own, with its token, its
/// priced private runs (`benchmark`, `profile`) too. A solver with no leaderboard submission is,
/// to anyone but itself, `404` as a name nobody holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SolverLedger {
    pub solver: String,
    pub rows: Vec<LedgerRow>,
    /// One per track and machine (as `LocalResult::machine_line` writes it), in the order of
    /// their first row.
    pub machines: Vec<MachineTransfer>,
}

/// How a local machine's measurements transferred to the arena's on one track: the ratios
/// ranked over local of its rows (1: as measured; below 1: the machine promised more).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineTransfer {
    pub track: String,
    pub machine: String,
    pub rows: u64,
    /// The geometric mean of the rows' ratios (a ratio's mean, so that 0.5 and 2 cancel).
    pub ratio_mean: f64,
    pub ratio_min: f64,
    pub ratio_max: f64,
    /// The rows whose local 95 % interval holds the ranked score.
    pub within_local_ci: u64,
}

/// `GET /api/tracks` (one entry per track) and `GET /api/tracks/{name}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrackView {
    pub name: String,
    pub description: String,
    pub runner_kind: String,
    pub clock_track: String,
    pub surface: Vec<String>,
    pub baseline: String,
    pub current_base: String,
    /// The pinned baseline's score: 1 by definition (every score is a speed ratio to it).
    pub baseline_score: f64,
    pub current_best_score: f64,
    /// The verdict metrics of the submission that made the current base (none before the first
    /// promotion): what the original's solvers found most useful.
    pub current_best_metrics: Option<serde_json::Value>,
    /// `always`, `after_promotion` or `never`: whose code the record shows.
    pub publish_code: String,
    pub rules: Rules,
    /// Ranked by score; submissions marked as cheats are left out.
    pub leaderboard: Vec<LeaderboardRow>,
    /// The baseline, then each promotion: the record over time.
    pub frontier: Vec<FrontierPoint>,
    /// Unfinished submissions, oldest first: those waiting with their position, those running
    /// with the runner that holds them.
    pub queue: Vec<QueueRow>,
}

/// What a track measures and how, in a few numbers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Rules {
    pub prompt_tokens: usize,
    pub decode_tokens: usize,
    /// DFlash block size (dflash tracks).
    pub block_size: Option<usize>,
    pub floor: f64,
    pub target_ci: f64,
    pub min_pairs: usize,
    pub max_pairs: usize,
    /// Relative margin over the current best that a promotion needs (both pricings).
    pub promotion_margin: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeaderboardRow {
    pub rank: usize,
    pub submission: String,
    pub solver: String,
    pub model: Option<String>,
    pub score: f64,
    /// What it ranks by: its score when promoted; when held, its score capped by its
    /// confirmation's and by the best it was judged against (it did not beat that best).
    pub rank_score: f64,
    pub ci95: Option<[f64; 2]>,
    /// Relative gain over the best score of the track when it was judged (for a promoted
    /// submission: over the best before its own promotion).
    pub gain: Option<f64>,
    /// The rank score of the row above minus this one's (none for the first).
    pub gap_to_above: Option<f64>,
    pub status: String,
    pub created_ms: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FrontierPoint {
    /// 0 for the baseline, then 1, 2, … for each promotion.
    pub seq: i64,
    pub submission: Option<String>,
    pub solver: Option<String>,
    pub score: f64,
    pub created_ms: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueRow {
    /// Empty for a private run (`private`).
    pub submission: String,
    /// Empty for a private run.
    pub solver: String,
    /// A private run (`test`, `benchmark`, `profile`): shown as waiting or running, not whose or
    /// which.
    #[serde(default)]
    pub private: bool,
    pub stage: String,
    /// The kind of runner the stage needs (`builder`, `cpu`, `cuda`).
    pub kind: String,
    /// Jobs ahead of it for that kind (while it waits).
    pub position: Option<i64>,
    /// The runner holding it (while it runs).
    pub runner: Option<String>,
    pub created_ms: i64,
}

/// `POST /api/runner/lease`.
#[derive(Debug, Serialize, Deserialize)]
pub struct LeaseRequest {
    /// Whether this runner can build (a CPU runner with the toolchain).
    pub builder: bool,
}

/// A leased job: one submission at one stage.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Job {
    pub submission: String,
    pub lease_id: String,
    pub lease_seconds: u64,
    pub stage: String,
    pub track: Track,
    pub base_commit: String,
    pub bundle_digest: String,
    /// Private results of the stages already finished, by stage (e.g. the build's artifacts).
    pub results: BTreeMap<String, serde_json::Value>,
}

/// `POST /api/runner/report`: how a stage ended.
#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    pub submission: String,
    pub lease_id: String,
    pub stage: String,
    /// `ok`, or the failure category (`policy:…`, `gate:…`, `infra:…`, …).
    pub outcome: String,
    /// What the public may read.
    pub detail: String,
    /// What later stages need; never published.
    pub result: serde_json::Value,
    /// Whether the reporting runner builds (it may keep the job for a next build stage).
    pub builder: bool,
    /// For an `infra:` outcome: whether the candidate's own process caused it (its worker
    /// crashed, hung, broke the protocol), not the runner or the reference. Such failures count
    /// against the solver's daily cap beyond the track's free allowance (`caps`).
    #[serde(default)]
    pub candidate_caused: bool,
}

/// The answer to a report: the next stage when this runner keeps the job.
#[derive(Debug, Serialize, Deserialize)]
pub struct ReportReply {
    pub next: Option<Job>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Heartbeat {
    pub submission: String,
    pub lease_id: String,
    /// What the stage is doing (the runner's words, e.g. the clock's pairs so far): shown as the
    /// running stage's `detail` until its report replaces it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
}

/// A built binary registered with the service: `build_key` → `artifact`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildRecord {
    pub build_key: String,
    pub artifact: String,
}

/// A bundle's bytes as `NewSubmission::bundle` carries them.
pub fn encode_bundle(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// An error body: what went wrong, in one line.
#[derive(Debug, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_submission_without_a_mode_is_a_leaderboard_one_and_an_unknown_one_is_refused_by_name() {
        let body = |mode: &str| {
            format!(
                r#"{{"track": "t", "note": "n", "model": null, "claimed_score": null, "bundle": ""{mode}}}"#
            )
        };
        let old: NewSubmission = serde_json::from_str(&body("")).unwrap();
        assert_eq!(old.mode, Mode::Leaderboard);
        for m in [
            Mode::Test,
            Mode::Benchmark,
            Mode::Profile,
            Mode::Leaderboard,
        ] {
            let n: NewSubmission =
                serde_json::from_str(&body(&format!(r#", "mode": "{m}""#))).unwrap();
            assert_eq!(n.mode, m);
            assert_eq!(serde_json::to_value(m).unwrap(), m.as_str());
        }
        let e = serde_json::from_str::<NewSubmission>(&body(r#", "mode": "trace""#))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("mode \"trace\": one of test, benchmark, profile, leaderboard"),
            "{e}"
        );
    }
}
