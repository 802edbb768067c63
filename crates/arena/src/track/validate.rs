//! A track's validation: every field checked in the file's order, each error naming the field
//! at fault (the tests and the operators read them).

use std::path::{Component, Path};

use anyhow::{bail, Context, Result};

use super::{
    check_name, Build, Caps, Clock, Deadlines, Goldens, ModelSpec, Track, Window, MAX_TOKENS,
};
use crate::bundle::is_digest;

/// The `fastdecode price` options a track's `clock.extra_args` may pass.
const CLOCK_TUNING: &[&str] = &[
    "--noise-windows",
    "--warmup-windows",
    "--windows",
    "--quiet-cpu",
    "--quiet-gpu-util",
    "--quiet-gpu-temp",
    "--quiet-wait",
    "--require-quiet",
    "--stall",
    "--outlier-factor",
    "--max-speedup",
    "--envelope",
    "--budget",
];

impl Track {
    /// Every field checked, naming the field at fault.
    pub fn validate(&self) -> Result<()> {
        check_name(&self.name, "name")?;
        if !["serial", "dflash"].contains(&self.clock_track.as_str()) {
            bail!("clock_track {:?}: serial or dflash", self.clock_track);
        }
        if !["cpu", "cuda"].contains(&self.runner_kind.as_str()) {
            bail!("runner_kind {:?}: cpu or cuda", self.runner_kind);
        }
        check_surface(&self.surface)?;
        if !is_commit(&self.baseline) {
            bail!("baseline {:?}: a full 40-digit commit hash", self.baseline);
        }
        if !["always", "after_promotion", "never"].contains(&self.publish_code.as_str()) {
            bail!(
                "publish_code {:?}: always, after_promotion or never",
                self.publish_code
            );
        }
        check_model(&self.model)?;
        check_goldens_and_window(&self.goldens, &self.window, &self.clock_track)?;
        check_clock(&self.clock)?;
        check_caps(&self.caps)?;
        if !(self.promotion.margin.is_finite() && self.promotion.margin >= 0.0) {
            bail!("promotion.margin {}: a number >= 0", self.promotion.margin);
        }
        check_build(&self.build, &self.caps)?;
        check_deadlines(&self.deadlines)
    }
}

fn is_commit(s: &str) -> bool {
    s.len() == 40
        && s.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// The editable surface: path globs, each relative and starting at a named directory or file.
fn check_surface(surface: &[String]) -> Result<()> {
    if surface.is_empty() {
        bail!("surface: no path globs");
    }
    for g in surface {
        glob::Pattern::new(g).with_context(|| format!("surface: glob {g:?}"))?;
        // A wildcard in the first component reaches the whole tree (Cargo.toml, the
        // tracks, build scripts): a surface starts at a named directory or file.
        let first = g.split('/').next().unwrap_or_default();
        if first.is_empty() || first.contains(['*', '?', '[']) {
            bail!("surface: glob {g:?} must start with a directory or file name, not a wildcard");
        }
        if g.starts_with('/') || g.split('/').any(|c| c == "..") {
            bail!("surface: glob {g:?} must be relative, without '..'");
        }
    }
    Ok(())
}

/// The model: a directory inside the baseline tree with its digest, or synthetic weights on
/// CUDA; and the worker's backend.
fn check_model(model: &ModelSpec) -> Result<()> {
    match (&model.dir, &model.synthetic) {
        (Some(d), None) => {
            if d.starts_with('/') || d.split('/').any(|c| c == "..") {
                bail!("model.dir {d:?}: a path inside the baseline tree");
            }
            match &model.digest {
                Some(x) if is_digest(x) => {}
                _ => bail!("model.digest: a model directory needs its sha256:… digest"),
            }
        }
        (None, Some(_)) if model.backend == "cuda" => {}
        (None, Some(p)) => bail!("model.synthetic {p:?}: synthetic weights need backend cuda"),
        _ => bail!("model: give exactly one of dir and synthetic"),
    }
    if !["cpu", "cuda"].contains(&model.backend.as_str()) {
        bail!("model.backend {:?}: cpu or cuda", model.backend);
    }
    Ok(())
}

/// The hidden goldens' digest, then the goldens' and the timed window's counts, token spans
/// and block sizes.
fn check_goldens_and_window(goldens: &Goldens, window: &Window, clock_track: &str) -> Result<()> {
    if !is_digest(&goldens.hidden) {
        bail!("goldens.hidden {:?}: a sha256:… digest", goldens.hidden);
    }
    for (v, f) in [
        (goldens.public_count, "goldens.public_count"),
        (goldens.hidden_count, "goldens.hidden_count"),
        (goldens.prompt_tokens, "goldens.prompt_tokens"),
        (goldens.tokens, "goldens.tokens"),
        (goldens.attempts_per_golden, "goldens.attempts_per_golden"),
        (window.prompt_tokens, "window.prompt_tokens"),
        (window.decode_tokens, "window.decode_tokens"),
    ] {
        if v == 0 {
            bail!("{f}: must be at least 1");
        }
    }
    for (prompt, made, f) in [
        (goldens.prompt_tokens, goldens.tokens, "goldens"),
        (window.prompt_tokens, window.decode_tokens, "window"),
    ] {
        if prompt.saturating_add(made) > MAX_TOKENS {
            bail!("{f}.prompt_tokens {prompt} + its tokens {made}: at most {MAX_TOKENS} in all");
        }
    }
    if !(1..=16).contains(&goldens.block_size) {
        bail!("goldens.block_size {}: 1 to 16", goldens.block_size);
    }
    if clock_track == "dflash" && !(2..=16).contains(&window.block_size) {
        bail!(
            "window.block_size {}: 2 to 16 on a dflash track",
            window.block_size
        );
    }
    Ok(())
}

/// The clock's floor, precision, pairs and budget, and the tuning it may be passed.
fn check_clock(c: &Clock) -> Result<()> {
    if !(c.floor.is_finite() && c.floor > 0.0) {
        bail!("clock.floor {}: a positive number", c.floor);
    }
    if !(c.target_ci > 0.0 && c.target_ci < 1.0) {
        bail!("clock.target_ci {}: in (0, 1)", c.target_ci);
    }
    if c.min_pairs < 4 || c.max_pairs < c.min_pairs {
        bail!(
            "clock.min_pairs {} / max_pairs {}: at least 4, and max at least min",
            c.min_pairs,
            c.max_pairs
        );
    }
    if !(c.time_budget.is_finite() && c.time_budget > 0.0) {
        bail!("clock.time_budget {}: positive seconds", c.time_budget);
    }
    // Only the clock's tuning: the runner names the builds, the model, the window, the
    // precision and where the result goes, and a track must not move any of them.
    for a in &c.extra_args {
        let option = a.split('=').next().unwrap_or_default();
        if option.starts_with('-') && !CLOCK_TUNING.contains(&option) {
            bail!(
                "clock.extra_args {a:?}: only the clock's tuning ({}) may be passed",
                CLOCK_TUNING.join(", ")
            );
        }
    }
    Ok(())
}

/// A submission's size caps and the daily failure allowances.
fn check_caps(caps: &Caps) -> Result<()> {
    if caps.file_bytes == 0 || caps.total_bytes < caps.file_bytes {
        bail!("caps: file_bytes must be positive and at most total_bytes");
    }
    if caps.failures_per_day == 0 {
        bail!("caps.failures_per_day 0: at least 1 (0 would refuse every submission)");
    }
    if caps.free_infra_per_day > 1000 {
        bail!(
            "caps.free_infra_per_day {}: at most 1000",
            caps.free_infra_per_day
        );
    }
    if caps.private_runs_per_day > 10_000 {
        bail!(
            "caps.private_runs_per_day {}: at most 10000",
            caps.private_runs_per_day
        );
    }
    Ok(())
}

/// The build's arguments and binary, kept inside its own target directory, and its size caps.
fn check_build(build: &Build, caps: &Caps) -> Result<()> {
    if build.cargo_args.is_empty() || build.binary.is_empty() {
        bail!("build: cargo_args and binary are required");
    }
    // The build's outputs stay in the build's own target directory, where the builder
    // looks for the binary and cleans up: no argument may send them anywhere else.
    if !Path::new(&build.binary)
        .components()
        .all(|c| matches!(c, Component::Normal(_)))
    {
        bail!(
            "build.binary {:?}: a path inside the build's target directory",
            build.binary
        );
    }
    let args = &build.cargo_args;
    for (i, a) in args.iter().enumerate() {
        let option = a.split('=').next().unwrap_or_default();
        let places = [
            "--target-dir",
            "--out-dir",
            "--artifact-dir",
            "--manifest-path",
        ];
        let config_moves = option == "--config"
            && args.get(i + 1).is_some_and(|v| v.contains("target-dir"))
            || a.starts_with("--config=") && a.contains("target-dir");
        if places.contains(&option) || config_moves {
            bail!("build.cargo_args {a:?}: the build's outputs are placed by the builder");
        }
    }
    if caps.artifact_bytes == 0 || caps.build_disk_bytes < caps.artifact_bytes {
        bail!("caps: artifact_bytes must be positive and at most build_disk_bytes");
    }
    Ok(())
}

/// Each stage's deadline: seconds in (0, 86400].
fn check_deadlines(d: &Deadlines) -> Result<()> {
    for (v, f) in [
        (d.build, "deadlines.build"),
        (d.kernels, "deadlines.kernels"),
        (d.gate, "deadlines.gate"),
        (d.price_grace, "deadlines.price_grace"),
        (d.profile, "deadlines.profile"),
    ] {
        if !(v.is_finite() && v > 0.0 && v <= 86_400.0) {
            bail!("{f} {v}: seconds in (0, 86400]");
        }
    }
    Ok(())
}
