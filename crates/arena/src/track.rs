//! Tracks are files (`tracks/*.toml` in the repository): what a solver may edit, what it is
//! measured against and how. The service loads them at start; runners receive them with each
//! job. Hidden material (the seeds of the hidden goldens and of the timed-prompt pool) is named
//! here only by its digest: the file itself lives in the service's hidden store, outside the
//! repository, and is sent only to runners (the trusted parents).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// Every field of a track checked (`Track::validate`).
mod validate;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Track {
    pub name: String,
    /// One line for listings.
    pub description: String,
    /// The clock's track: `serial` or `dflash` (`docs/spec/challenge.md`'s two scores).
    pub clock_track: String,
    /// Kind of runner that gates and prices (`cpu`, `cuda`); builds always run on a builder.
    pub runner_kind: String,
    /// Path globs a submission may change (`**` spans directories).
    pub surface: Vec<String>,
    /// The pinned baseline commit: the denominator of every score and the gate's reference.
    pub baseline: String,
    /// Whose code the public pages show as a diff: `always` (every submission's), `after_promotion`
    /// (a promoted change's) or `never`; notes are always public.
    pub publish_code: String,
    pub model: ModelSpec,
    pub goldens: Goldens,
    pub window: Window,
    pub clock: Clock,
    pub caps: Caps,
    pub promotion: Promotion,
    pub build: Build,
    /// How long each stage's child may run before it is stopped (and the stage fails).
    #[serde(default)]
    pub deadlines: Deadlines,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// A model directory inside the baseline tree (`assets/laguna-tiny`) ...
    pub dir: Option<String>,
    /// ... or a synthetic preset generated in GPU memory (`xs2.1`) with its seed.
    pub synthetic: Option<String>,
    #[serde(default)]
    pub seed: u64,
    /// `sha256:…` of the directory (what `fastdecode verify` prints); checked by the runner.
    pub digest: Option<String>,
    /// Worker backend: `cpu` or `cuda`.
    pub backend: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Goldens {
    /// Seed of the public goldens (anyone can make them with `fastdecode golden make`): the
    /// tripwire run before any hidden byte is touched.
    pub public_seed: u64,
    pub public_count: usize,
    /// `sha256:…` of the hidden file (JSON: `golden_seeds`, `pool_seeds`).
    pub hidden: String,
    pub hidden_count: usize,
    pub prompt_tokens: usize,
    pub tokens: usize,
    /// Random prompts tried per golden before the screen gives up (a trained model's
    /// continuations of random prompts often loop).
    pub attempts_per_golden: usize,
    /// DFlash block size of the gate's forced-rejection exactness check.
    pub block_size: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Window {
    pub prompt_tokens: usize,
    pub decode_tokens: usize,
    /// DFlash block size K and draft source (dflash tracks).
    pub block_size: usize,
    pub draft: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Clock {
    pub floor: f64,
    /// Relative half-width the clock aims at.
    pub target_ci: f64,
    pub min_pairs: usize,
    pub max_pairs: usize,
    pub time_budget: f64,
    /// More `fastdecode price` options, passed as they are (e.g. the quiet thresholds of a
    /// shared machine).
    #[serde(default)]
    pub extra_args: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Caps {
    pub total_bytes: u64,
    pub file_bytes: u64,
    /// How much the changed files may grow beyond their base versions, in all.
    pub growth_bytes: u64,
    /// Failures a solver may have per day before intake answers 429: its attributable ones, its
    /// candidate-caused infrastructure failures beyond `free_infra_per_day`, and its submissions
    /// still queued or running (`service/caps.rs`).
    pub failures_per_day: u32,
    /// The largest binary a build may make.
    #[serde(default = "default_artifact_bytes")]
    pub artifact_bytes: u64,
    /// The most disk a build's directory (sources, target, cargo's own files) may take.
    #[serde(default = "default_build_disk_bytes")]
    pub build_disk_bytes: u64,
    /// Infrastructure failures a solver's candidate may cause per day (its worker crashed, hung,
    /// broke the protocol) before each counts as a failure (default 2).
    #[serde(default = "default_free_infra_per_day")]
    pub free_infra_per_day: u32,
    /// Private runs (`--mode test|benchmark`) a solver may start per day, whatever their
    /// outcome; they count against this quota only, never against `failures_per_day` (default
    /// 20; 0 takes no private runs on the track).
    #[serde(default = "default_private_runs_per_day")]
    pub private_runs_per_day: u32,
}

fn default_private_runs_per_day() -> u32 {
    20
}

fn default_free_infra_per_day() -> u32 {
    2
}

fn default_artifact_bytes() -> u64 {
    128 << 20
}

fn default_build_disk_bytes() -> u64 {
    16 << 30
}

/// Seconds each stage's child may run: past it the child (and all it started) is killed and the
/// stage fails (`build:deadline`, `gate:deadline`, `price:deadline`; a runner that holds a job
/// past its deadline cannot hold the queue).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deadlines {
    #[serde(default = "default_build_seconds")]
    pub build: f64,
    /// Compiling a CUDA build's kernel modules, once per build.
    #[serde(default = "default_kernels_seconds")]
    pub kernels: f64,
    #[serde(default = "default_gate_seconds")]
    pub gate: f64,
    /// Beyond the clock's own `time_budget` (the pair under way, the judge, start-ups).
    #[serde(default = "default_price_grace_seconds")]
    pub price_grace: f64,
    /// Each child of a profile run's profile stage (its `bench --profile`, on a CUDA track its
    /// `bench --trace`); past it the profile says so, and the run keeps its pricing.
    #[serde(default = "default_profile_seconds")]
    pub profile: f64,
}

fn default_build_seconds() -> f64 {
    1800.0
}

fn default_kernels_seconds() -> f64 {
    600.0
}

fn default_gate_seconds() -> f64 {
    900.0
}

fn default_price_grace_seconds() -> f64 {
    900.0
}

fn default_profile_seconds() -> f64 {
    300.0
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            build: default_build_seconds(),
            kernels: default_kernels_seconds(),
            gate: default_gate_seconds(),
            price_grace: default_price_grace_seconds(),
            profile: default_profile_seconds(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Promotion {
    /// A submission is promoted when the lower end of its interval, and of its confirmation
    /// pricing's, beats the current best score by this relative margin.
    pub margin: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Build {
    /// `cargo` arguments that build the worker binary from the tree (offline, locked).
    pub cargo_args: Vec<String>,
    /// The binary they produce, relative to the target directory.
    pub binary: String,
}

/// The hidden material: read only by the trusted parent.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hidden {
    pub golden_seeds: Vec<u64>,
    pub pool_seeds: Vec<u64>,
}

impl Hidden {
    pub fn validate(&self) -> Result<()> {
        let mut pool = self.pool_seeds.clone();
        pool.sort_unstable();
        pool.dedup();
        if pool.len() < 8 {
            bail!(
                "pool_seeds: {} distinct timed-prompt seeds, at least 8 needed",
                pool.len()
            );
        }
        if self.golden_seeds.is_empty() {
            bail!("golden_seeds: empty");
        }
        Ok(())
    }
}

fn name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && !s.starts_with('.')
}

/// A name for solvers, runners and tracks: 1 to 64 of `[A-Za-z0-9._-]`, not starting with a dot.
pub fn check_name(s: &str, what: &str) -> Result<()> {
    if !name_ok(s) {
        bail!("{what} {s:?}: use 1 to 64 letters, digits, '.', '_' or '-' (not starting with '.')");
    }
    Ok(())
}

impl Track {
    pub fn parse(text: &str, file: &Path) -> Result<Track> {
        let t: Track = toml::from_str(text).with_context(|| file.display().to_string())?;
        t.validate()
            .with_context(|| format!("{}: track {}", file.display(), t.name))?;
        Ok(t)
    }

    /// Whether `path` is on the editable surface.
    pub fn on_surface(&self, path: &str) -> bool {
        let opts = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: false,
        };
        self.surface
            .iter()
            .filter_map(|g| glob::Pattern::new(g).ok())
            .any(|p| p.matches_with(path, opts))
    }

    /// Whether `path` is part of the frozen model (weights, manifests): never changeable, even
    /// by a surface that would cover it.
    pub fn frozen(&self, path: &str) -> bool {
        let name = path.rsplit('/').next().unwrap_or(path);
        let in_model = self
            .model
            .dir
            .as_deref()
            .is_some_and(|d| path == d || path.starts_with(&format!("{d}/")));
        in_model || name == "MANIFEST" || name.ends_with(".safetensors")
    }
}

/// The most tokens a golden or a window may span (prompt and generated): far above any model's
/// context, it keeps a typo from sizing buffers by it.
pub const MAX_TOKENS: usize = 1 << 20;

/// Every `*.toml` in `dir`, by name; a malformed file is an error naming it.
pub fn load_dir(dir: &Path) -> Result<BTreeMap<String, Track>> {
    let mut out = BTreeMap::new();
    let rd = std::fs::read_dir(dir).with_context(|| format!("--tracks {}", dir.display()))?;
    let mut files: Vec<_> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    for f in files {
        let text = crate::store::read_regular_text(&f)?;
        let t = Track::parse(&text, &f)?;
        if let Some(old) = out.insert(t.name.clone(), t) {
            bail!("{}: a second track named {}", f.display(), old.name);
        }
    }
    if out.is_empty() {
        bail!("--tracks {}: no *.toml track files", dir.display());
    }
    Ok(out)
}

/// The repository's own tracks (`tracks/`), for the crate's tests.
#[cfg(test)]
pub(crate) fn repo_tracks() -> BTreeMap<String, Track> {
    load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tracks")).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_repository_tracks_load() {
        let t = repo_tracks();
        for name in ["serial-tiny", "dflash-tiny", "serial-xs2.1", "dflash-xs2.1"] {
            assert!(t.contains_key(name), "{name}");
        }
        assert_eq!(t["serial-xs2.1"].runner_kind, "cuda");
    }

    #[test]
    fn the_surface_spans_directories_but_not_siblings() {
        let t = &repo_tracks()["serial-tiny"];
        assert!(t.on_surface("crates/cpu/src/ops.rs"));
        assert!(t.on_surface("crates/engine/src/decode.rs"));
        assert!(!t.on_surface("crates/clock/src/price.rs"));
        assert!(!t.on_surface("crates/cpu/src.rs"));
        assert!(!t.on_surface("Cargo.lock"));
        assert!(t.frozen("assets/laguna-tiny/model.safetensors"));
        assert!(t.frozen("crates/cpu/src/MANIFEST"));
        assert!(!t.frozen("crates/cpu/src/ops.rs"));
    }

    #[test]
    fn a_bad_field_is_named() {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tracks/serial-tiny.toml"),
        )
        .unwrap();
        let bad = text.replace("runner_kind = \"cpu\"", "runner_kind = \"tpu\"");
        let e = Track::parse(&bad, Path::new("t.toml")).unwrap_err();
        assert!(format!("{e:#}").contains("runner_kind"), "{e:#}");
        let bad = text.replace("floor = 0.95", "floor = -1");
        let e = Track::parse(&bad, Path::new("t.toml")).unwrap_err();
        assert!(format!("{e:#}").contains("clock.floor"), "{e:#}");
        let bad = text.replace("free_infra_per_day = 2", "free_infra_per_day = 5000");
        let e = Track::parse(&bad, Path::new("t.toml")).unwrap_err();
        assert!(
            format!("{e:#}").contains("caps.free_infra_per_day"),
            "{e:#}"
        );
        let bad = text.replace(
            "free_infra_per_day = 2",
            "free_infra_per_day = 2\nprivate_runs_per_day = 20000",
        );
        let e = Track::parse(&bad, Path::new("t.toml")).unwrap_err();
        assert!(
            format!("{e:#}").contains("caps.private_runs_per_day 20000: at most 10000"),
            "{e:#}"
        );
        // Absent: 20 a day.
        assert_eq!(
            Track::parse(&text, Path::new("t.toml"))
                .unwrap()
                .caps
                .private_runs_per_day,
            20
        );
        let bad = text.replace("failures_per_day = 10", "failures_per_day = 0");
        let e = Track::parse(&bad, Path::new("t.toml")).unwrap_err();
        assert!(format!("{e:#}").contains("caps.failures_per_day"), "{e:#}");
        for extra in [
            "\"--out\", \"/tmp/x\"",
            "\"--candidate=/bin/true\"",
            "\"--min-pairs\", \"1\"",
        ] {
            let bad = text.replace(
                "time_budget = 600.0",
                &format!("time_budget = 600.0\nextra_args = [{extra}]"),
            );
            let e = format!("{:#}", Track::parse(&bad, Path::new("t.toml")).unwrap_err());
            assert!(
                e.contains("clock.extra_args") && e.contains("--quiet-cpu"),
                "{e}"
            );
        }
        let fine = text.replace(
            "time_budget = 600.0",
            "time_budget = 600.0\nextra_args = [\"--quiet-cpu\", \"1.0\", \"--warmup-windows=1\"]",
        );
        Track::parse(&fine, Path::new("t.toml")).unwrap();
        let binary = "binary = \"release/fastdecode\"";
        let args = "\"--no-default-features\"]";
        for (from, to, names) in [
            (
                "prompt_tokens = 512",
                "prompt_tokens = 9223372036854775807",
                "window.prompt_tokens",
            ),
            (
                "prompt_tokens = 32",
                "prompt_tokens = 1048576",
                "goldens.prompt_tokens",
            ),
            (binary, "binary = \"../../elsewhere\"", "build.binary"),
            (binary, "binary = \"/usr/bin/true\"", "build.binary"),
            (args, "\"--target-dir\", \"/tmp/x\"]", "build.cargo_args"),
            (args, "\"--artifact-dir=/tmp/x\"]", "build.cargo_args"),
            (
                args,
                "\"--config\", \"build.target-dir='/tmp/x'\"]",
                "build.cargo_args",
            ),
        ] {
            assert!(text.contains(from), "{from}");
            let e = Track::parse(&text.replacen(from, to, 1), Path::new("t.toml")).unwrap_err();
            assert!(format!("{e:#}").contains(names), "{to}: {e:#}");
        }
        for glob in ["**", "*/src/**", "[c]rates/**", "/crates/**"] {
            let bad = text.replace(
                "surface = [\"crates/cpu/src/**\", \"crates/engine/src/**\"]",
                &format!("surface = [{glob:?}]"),
            );
            assert_ne!(bad, text);
            let e = Track::parse(&bad, Path::new("t.toml")).unwrap_err();
            assert!(format!("{e:#}").contains("surface"), "{glob}: {e:#}");
        }
        // What the arena's own tests add to a build stays accepted.
        let quick = text.replace(
            "\"build\", \"--release\"",
            "\"build\", \"--config\", \"profile.release.incremental=true\", \"--release\"",
        );
        assert_ne!(quick, text);
        Track::parse(&quick, Path::new("t.toml")).unwrap();
    }

    #[test]
    fn the_free_infra_allowance_defaults_to_two() {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tracks/serial-tiny.toml"),
        )
        .unwrap();
        let without: String = text
            .lines()
            .filter(|l| !l.contains("free_infra_per_day"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_ne!(without, text);
        let t = Track::parse(&without, Path::new("t.toml")).unwrap();
        assert_eq!(t.caps.free_infra_per_day, 2);
    }
}
