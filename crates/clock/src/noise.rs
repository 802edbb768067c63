//! The noise model: what one phase's windows say about the build, and how many windows a phase
//! needs on this machine.
//!
//! Timing noise on a shared machine is one-sided and additive: another process, an interrupt or
//! the host's scheduler can only add time to a window, never take it away. Under such noise the
//! minimum over repeated runs is the estimator that converges to the undisturbed time, while the
//! mean and the median converge to "undisturbed + the typical disturbance", which changes with the
//! machine's load (Chen & Revels 2016, "Robust benchmarking in noisy environments", the basis of
//! Julia's BenchmarkTools). So each phase runs several windows and reports their minimum (the
//! mean is kept for the record). The minimum fails only when every window is disturbed, as when
//! another process holds a CPU for the whole phase; so a phase none of whose windows ran without
//! its worker waiting on a run queue (`telemetry`) is re-run.
//!
//! What is measured is the whole window, from the parent writing the request to the parent
//! reading the last reply: the only boundaries the parent observes itself. The worker's `seeded`
//! line is its own choice of when to speak (a build can decode most of the window before saying
//! it), so it never splits what is priced.

use serde::Serialize;

/// The robust and the mean whole-window seconds of one phase.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Figures {
    pub window_seconds: f64,
}

/// The phase statistic the score uses: the minimum whole window.
pub fn robust(window_seconds: &[f64]) -> Figures {
    Figures {
        window_seconds: window_seconds.iter().copied().fold(f64::INFINITY, f64::min),
    }
}

/// The mean whole window, for the record (the statistic a single-window clock used to score).
pub fn means(window_seconds: &[f64]) -> Figures {
    Figures {
        window_seconds: crate::stats::mean(window_seconds),
    }
}

/// The fewest and the most scored windows a phase runs when they are sized from the noise.
pub const MIN_WINDOWS: usize = 3;
pub const MAX_WINDOWS: usize = 16;

/// The chance, at most, that every scored window of a phase is disturbed (so that its minimum is
/// a disturbed window): the number of windows is sized for it.
pub const ALL_DISTURBED: f64 = 0.01;

/// What the noise measurement found and what it decided.
#[derive(Debug, Clone, Serialize)]
pub struct NoiseReport {
    /// Identical windows timed in one warm baseline worker (unscored), whole-window seconds.
    pub window_seconds: Vec<f64>,
    pub min_seconds: f64,
    pub median_seconds: f64,
    pub mean_seconds: f64,
    /// The noise figure: median / min − 1, the typical one-sided disturbance of one window.
    pub relative_spread: f64,
    /// mean / min − 1: what a mean-of-windows statistic would carry on top of the build's time.
    pub mean_excess: f64,
    /// A window more than this fraction above the best, or whose worker waited on a run queue
    /// for more than this fraction of it, counts as disturbed (half the precision aimed at: a
    /// smaller disturbance is below what the pricing can resolve).
    pub disturbance_tolerance: f64,
    /// Seconds each identical window's worker waited on a run queue (where the kernel says).
    pub runqueue_wait_seconds: Vec<Option<f64>>,
    /// Share of the identical windows that were disturbed.
    pub disturbed_fraction: f64,
    /// Windows needed so that all of them are disturbed with probability at most `ALL_DISTURBED`
    /// (`usize::MAX` when every window was).
    pub windows_for_robustness: usize,
    /// Seconds from spawning the worker to its `ready` line.
    pub spawn_seconds: f64,
    /// Most windows worth timing per phase: as many as fit in the phase's fixed cost (start-up
    /// and warm-up), since time spent beyond that buys less than another pair would.
    pub windows_cap: usize,
    /// The scored windows each phase runs, and why.
    pub windows_per_phase: usize,
    pub sized_by: String,
}

/// Whether a window of `seconds` whose worker waited `wait` seconds on a run queue was disturbed
/// by another process (beyond `tolerance` of its length).
pub fn waited(seconds: f64, wait: Option<f64>, tolerance: f64) -> bool {
    wait.is_some_and(|w| w > tolerance * seconds)
}

/// Sizes the scored windows of a phase from the noise windows (`window_seconds`, identical
/// windows of one warm worker, and their run-queue waits), the worker's start-up time and the
/// phase's warm-up windows.
///
/// Two limits. Robustness: with a fraction `c` of windows disturbed, all `k` are disturbed with
/// probability `c^k`, so `k = ⌈ln ALL_DISTURBED / ln c⌉`. Cost: a phase's fixed cost is the
/// worker's start-up and warm-up; once the timed windows take longer than that, the next window
/// buys less than the next pair would (which also averages over the process-to-process
/// variation that no number of windows in one process can), so `k` is capped at the number of
/// windows that fit in the fixed cost. Both are clamped to `[MIN_WINDOWS, MAX_WINDOWS]`.
pub fn size_windows(
    window_seconds: &[f64],
    waits: &[Option<f64>],
    tolerance: f64,
    spawn_seconds: f64,
    warmup_windows: usize,
    fixed: Option<usize>,
) -> NoiseReport {
    let mut sorted = window_seconds.to_vec();
    sorted.sort_by(f64::total_cmp);
    let min = sorted.first().copied().unwrap_or(f64::NAN);
    let median = crate::stats::median(&sorted);
    let mean = crate::stats::mean(&sorted);
    let disturbed = window_seconds
        .iter()
        .zip(waits.iter().chain(std::iter::repeat(&None)))
        .filter(|&(&x, &w)| x > min * (1.0 + tolerance) || waited(x, w, tolerance))
        .count();
    let c = disturbed as f64 / sorted.len().max(1) as f64;
    let for_robustness = if c <= 0.0 {
        MIN_WINDOWS
    } else if c >= 1.0 {
        usize::MAX
    } else {
        (ALL_DISTURBED.ln() / c.ln()).ceil() as usize
    };
    let fixed_cost = spawn_seconds + warmup_windows as f64 * median;
    let cap = if median > 0.0 {
        ((fixed_cost / median).round() as usize).clamp(MIN_WINDOWS, MAX_WINDOWS)
    } else {
        MAX_WINDOWS
    };
    let (k, why) = match (fixed, for_robustness) {
        (Some(k), _) => (k, "--windows".to_string()),
        (None, r) if r <= cap => (
            r.max(MIN_WINDOWS),
            format!(
                "robustness: {:.0} % of identical windows disturbed, so {} windows are all disturbed with probability <= {ALL_DISTURBED}",
                100.0 * c,
                r.max(MIN_WINDOWS)
            ),
        ),
        (None, _) => (
            cap,
            format!(
                "cost: {:.0} % of identical windows disturbed; {cap} windows fit in the phase's fixed cost ({:.3} s start-up + warm-up)",
                100.0 * c,
                fixed_cost
            ),
        ),
    };
    NoiseReport {
        window_seconds: window_seconds.to_vec(),
        min_seconds: min,
        median_seconds: median,
        mean_seconds: mean,
        relative_spread: median / min - 1.0,
        mean_excess: mean / min - 1.0,
        disturbance_tolerance: tolerance,
        runqueue_wait_seconds: waits.to_vec(),
        disturbed_fraction: c,
        windows_for_robustness: for_robustness,
        spawn_seconds,
        windows_cap: cap,
        windows_per_phase: k,
        sized_by: why,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_is_its_fastest_whole_window() {
        let w = [3.0, 2.5, 4.0];
        assert_eq!(robust(&w).window_seconds, 2.5);
        assert!((means(&w).window_seconds - 9.5 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn windows_are_sized_by_the_share_of_disturbed_windows_and_capped_by_cost() {
        // 16 identical windows, 4 of them disturbed (more than 1 % above the best): c = 0.25,
        // 0.25^4 = 0.004 <= 0.01 < 0.25^3, so 4 windows; the fixed cost (2 s) is worth 20 windows
        // of 0.1 s, above the robustness need.
        let mut w = vec![0.100; 12];
        w.extend([0.102, 0.150, 0.300, 0.120]);
        let r = size_windows(&w, &[], 0.01, 1.8, 2, None);
        assert_eq!(r.windows_for_robustness, 4);
        assert_eq!(r.windows_cap, MAX_WINDOWS);
        assert_eq!(r.windows_per_phase, 4);
        assert!((r.disturbed_fraction - 0.25).abs() < 1e-12);
        // A cheap worker (0.35 s start-up + 2 warm-up windows of the median 0.175 s: 4 windows)
        // caps it at 4 when all but the best window are disturbed (0.9375^72 < 0.01).
        let busy: Vec<f64> = (0..16).map(|i| 0.1 + 0.01 * i as f64).collect();
        let r = size_windows(&busy, &[], 0.01, 0.35, 2, None);
        assert_eq!(r.windows_for_robustness, 72);
        assert_eq!(r.windows_per_phase, 4);
        assert!(r.sized_by.starts_with("cost"), "{}", r.sized_by);
        // A quiet machine needs only the minimum; --windows overrides everything.
        let r = size_windows(&[0.1; 8], &[], 0.01, 5.0, 2, None);
        assert_eq!(r.windows_per_phase, MIN_WINDOWS);
        // The same quiet-looking windows, half of which waited 2 ms of their 100 ms on a run
        // queue (another process had the CPU): 7 windows (0.5^7 < 0.01).
        let waits = [Some(0.002), Some(0.0), Some(0.002), Some(0.0)].repeat(2);
        let r = size_windows(&[0.1; 8], &waits, 0.01, 5.0, 2, None);
        assert_eq!((r.disturbed_fraction, r.windows_per_phase), (0.5, 7));
        assert!(waited(0.1, Some(0.002), 0.01) && !waited(0.1, Some(0.0009), 0.01));
        assert!(!waited(0.1, None, 0.01));
        assert_eq!(
            size_windows(&busy, &[], 0.01, 0.35, 2, Some(9)).windows_per_phase,
            9
        );
    }
}
