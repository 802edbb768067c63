//! From the phases' figures to a verdict: the score of a set of pairs
//! (`docs/spec/challenge.md`), its 95 % interval, when to stop adding pairs, and what the
//! interval says about the floor.
//!
//! Scores, from whole windows only (request written → last reply read, both instants the
//! parent's own): serial = the baseline's mean window over the candidate's; DFlash = raw / noop
//! with raw = mean baseline serial window ÷ mean candidate DFlash window and noop the same ratio
//! for the unmodified no-op build. A build that moves work from one part of the window to
//! another (decoding ahead before it says `seeded`) scores what it saves in all, nothing more.
//!
//! Stopping is decided on the interval's *width*, never on where it lies, except that an interval
//! that straddles the floor cannot stop: stopping on location ("stop once it looks significant")
//! would make the verdict a random walk's first excursion, while the width of the interval is,
//! for the no-op the clock must never reject, independent of the side its centre falls on.

use serde::Serialize;

use crate::noise::Figures;
use crate::stats::sequential_ci;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Track {
    Serial,
    Dflash,
}

impl std::str::FromStr for Track {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "serial" => Ok(Track::Serial),
            "dflash" => Ok(Track::Dflash),
            o => Err(format!("unknown track {o:?} (serial or dflash)")),
        }
    }
}

/// One accepted pair's phase figures (robust, or the means for the record).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairFigures {
    pub baseline: Figures,
    pub candidate: Figures,
    /// The DFlash track's no-op build.
    pub noop: Option<Figures>,
}

/// A score and, on the DFlash track, its two factors (raw and the no-op's reference).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Components {
    pub score: f64,
    pub raw: Option<f64>,
    pub noop: Option<f64>,
}

fn mean_of(pairs: &[PairFigures], ix: &[usize], f: impl Fn(&PairFigures) -> f64) -> f64 {
    ix.iter().map(|&i| f(&pairs[i])).sum::<f64>() / ix.len().max(1) as f64
}

/// The score of the pairs in `ix` (indices into `pairs`; the jackknife leaves one out).
pub fn score(track: Track, pairs: &[PairFigures], ix: &[usize]) -> Components {
    let b = mean_of(pairs, ix, |p| p.baseline.window_seconds);
    let c = mean_of(pairs, ix, |p| p.candidate.window_seconds);
    match track {
        Track::Serial => Components {
            score: b / c,
            raw: None,
            noop: None,
        },
        Track::Dflash => {
            let n = mean_of(pairs, ix, |p| p.noop.map_or(f64::NAN, |f| f.window_seconds));
            let (raw, noop) = (b / c, b / n);
            Components {
                score: raw / noop,
                raw: Some(raw),
                noop: Some(noop),
            }
        }
    }
}

/// The score with its 95 % interval over pairs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Interval {
    pub score: f64,
    pub lo: f64,
    pub hi: f64,
    /// (hi − lo) / 2 / score: relative, so a target means the same precision at any speed-up.
    pub half_width: f64,
}

/// The interval (`stats::sequential_ci`) of the score over `pairs`, of which the first `first`
/// ran before the first look at the interval (`Rule::min_pairs`).
pub fn interval(track: Track, pairs: &[PairFigures], first: usize) -> Interval {
    let all: Vec<usize> = (0..pairs.len()).collect();
    let s = score(track, pairs, &all).score;
    let (lo, hi) = sequential_ci(pairs.len(), first, |ix| score(track, pairs, ix).score);
    Interval {
        score: s,
        lo,
        hi,
        half_width: (hi - lo) / 2.0 / s,
    }
}

/// Why a pricing stopped adding pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// The interval's half-width reached the target, clear of the floor.
    TargetReached,
    /// A fixed number of pairs (`--pairs`) was asked for and run, clear of the floor.
    PairsDone,
    PairBudget,
    TimeBudget,
    /// Too many pairs were not accepted (not quiescent, disturbed) to reach the pairs wanted.
    AttemptBudget,
}

/// When to stop adding pairs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Rule {
    /// Pairs always run before the first look at the interval.
    pub min_pairs: usize,
    /// The pair budget.
    pub max_pairs: usize,
    /// Stop once the half-width is at most this (`None`: a fixed number of pairs, `min_pairs`).
    pub target_half_width: Option<f64>,
    pub floor: f64,
}

impl Rule {
    /// After `n` accepted pairs whose interval is `iv`: stop, and why, or `None` to add a pair.
    /// With a target, the rule looks only at an even number of pairs, so as many pairs ran the
    /// baseline first as the candidate first and an order effect cancels in the means.
    pub fn check(&self, n: usize, iv: &Interval, out_of_time: bool) -> Option<Stop> {
        if n < self.min_pairs {
            return None;
        }
        let clear = iv.hi < self.floor || iv.lo >= self.floor;
        if clear {
            match self.target_half_width {
                Some(h) if n.is_multiple_of(2) && iv.half_width <= h => {
                    return Some(Stop::TargetReached)
                }
                None => return Some(Stop::PairsDone),
                _ => {}
            }
        }
        if n >= self.max_pairs {
            Some(Stop::PairBudget)
        } else if out_of_time {
            Some(Stop::TimeBudget)
        } else {
            None
        }
    }
}

/// What an interval says: `passed`, `below_floor` (the whole interval below the floor) or
/// `infra:inconclusive` (it straddles the floor: the noise, not the build, decides which side).
pub fn verdict(iv: &Interval, floor: f64) -> &'static str {
    if iv.hi < floor {
        "below_floor"
    } else if iv.lo < floor {
        "infra:inconclusive"
    } else {
        "passed"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::noise::robust;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use rand_distr::{Distribution, Exp, Normal};

    /// A simulated machine: each phase runs in a fresh process whose speed differs from the
    /// next by a log-normal factor (`process_sd`, what no number of windows in one process
    /// averages away), on a machine whose speed wanders (an AR(1) walk per phase, `drift_sd`);
    /// each window has a little symmetric jitter and, with probability `disturbed`, one-sided
    /// extra time (exponential, mean `disturbance` of the window). `slowdown` multiplies the
    /// candidate's time.
    struct Machine {
        process_sd: f64,
        drift_sd: f64,
        disturbed: f64,
        disturbance: f64,
        windows: usize,
        slowdown: f64,
    }

    impl Machine {
        fn phase(&self, rng: &mut ChaCha8Rng, drift: &mut f64, slow: f64) -> Figures {
            *drift = 0.7 * *drift + Normal::new(0.0, self.drift_sd).unwrap().sample(rng);
            let speed = (Normal::new(0.0, self.process_sd).unwrap().sample(rng) + *drift).exp();
            let jitter = Normal::new(0.0, 0.002).unwrap();
            let extra = Exp::new(1.0 / self.disturbance).unwrap();
            let w: Vec<f64> = (0..self.windows)
                .map(|_| {
                    let mut x = slow * speed * (1.0 + jitter.sample(rng));
                    if rng.random::<f64>() < self.disturbed {
                        x += extra.sample(rng);
                    }
                    x
                })
                .collect();
            robust(&w)
        }

        /// One pricing under `rule`: (final interval, pairs used).
        fn price(&self, rule: &Rule, seed: u64) -> (Interval, usize) {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut drift = 0.0;
            let mut pairs = vec![];
            loop {
                let candidate_first = pairs.len() % 2 == 1;
                let (b, c) = if candidate_first {
                    let c = self.phase(&mut rng, &mut drift, self.slowdown);
                    (self.phase(&mut rng, &mut drift, 1.0), c)
                } else {
                    let b = self.phase(&mut rng, &mut drift, 1.0);
                    (b, self.phase(&mut rng, &mut drift, self.slowdown))
                };
                pairs.push(PairFigures {
                    baseline: b,
                    candidate: c,
                    noop: None,
                });
                if pairs.len() < rule.min_pairs {
                    continue;
                }
                let iv = interval(Track::Serial, &pairs, rule.min_pairs);
                if rule.check(pairs.len(), &iv, false).is_some() {
                    return (iv, pairs.len());
                }
            }
        }
    }

    const NOISY: Machine = Machine {
        process_sd: 0.02,
        drift_sd: 0.01,
        disturbed: 0.3,
        disturbance: 0.2,
        windows: 4,
        slowdown: 1.0,
    };

    /// Coverage of the truth (1.0 for a no-op) by the final interval over `runs` pricings.
    fn coverage(m: &Machine, rule: &Rule, runs: u64, truth: f64) -> (f64, f64) {
        let mut covered = 0;
        let mut pairs = 0;
        for seed in 0..runs {
            let (iv, n) = m.price(rule, seed);
            covered += (iv.lo <= truth && truth <= iv.hi) as usize;
            pairs += n;
        }
        (covered as f64 / runs as f64, pairs as f64 / runs as f64)
    }

    #[test]
    fn the_interval_covers_95_percent_of_no_ops_at_small_n_and_when_stopping_on_width() {
        // Nominal 95 % must cover 93-97 % of simulated no-ops: at the fewest pairs allowed (4),
        // and under the precision-driven rule at the default target (1 %) and coarser ones
        // (2 % and 3 %, from 10 and from 4 pairs), where stopping when the interval happens to
        // be narrow is the way a sequential interval undercovers: the plain jackknife-t covered
        // 91.9 % stopping at 2 % from 4 pairs, 93.75 % from 10; Stein's two-stage form
        // (`stats::sequential_ci`) is what keeps these inside.
        //
        // The test's own false-failure rate: each coverage is a count over 20000 seeded runs, so
        // the test is deterministic. Were the seeds other ones, a method whose true coverage p
        // lies in [0.936, 0.964] would leave [0.93, 0.97] with probability at most
        // P(|Z| > 0.006 / sqrt(0.936 * 0.064 / 20000) = 3.46) = 5e-4 per count; the coverages
        // measured (0.948, 0.960, 0.949, 0.955, 0.954, each +- 0.0015) put p there, and the count
        // nearest an edge (0.960) is 6.5 standard errors inside, so below 1e-5 for the whole test.
        let runs = 20_000;
        let rule = |min_pairs, max_pairs, target| Rule {
            min_pairs,
            max_pairs,
            target_half_width: target,
            floor: 0.95,
        };
        let mut report = vec![];
        for (name, r) in [
            ("4 pairs", rule(4, 4, None)),
            ("to 1 %", rule(10, 200, Some(0.01))),
            ("to 2 %", rule(10, 200, Some(0.02))),
            ("to 2 % from 4 pairs", rule(4, 200, Some(0.02))),
            ("to 3 % from 4 pairs", rule(4, 200, Some(0.03))),
        ] {
            let (cov, n) = coverage(&NOISY, &r, runs, 1.0);
            report.push(format!("{name}: coverage {cov:.4} at {n:.1} pairs"));
            assert!((0.93..=0.97).contains(&cov), "{report:?}");
        }
        eprintln!("{report:?}");
    }

    #[test]
    fn stopping_and_verdicts() {
        let rule = Rule {
            min_pairs: 8,
            max_pairs: 20,
            target_half_width: Some(0.01),
            floor: 0.95,
        };
        let iv = |lo: f64, hi: f64| Interval {
            score: (lo + hi) / 2.0,
            lo,
            hi,
            half_width: (hi - lo) / (lo + hi),
        };
        // Narrow and clear: stop, but only at an even count and from min_pairs on.
        assert_eq!(
            rule.check(8, &iv(0.992, 1.008), false),
            Some(Stop::TargetReached)
        );
        assert_eq!(rule.check(9, &iv(0.992, 1.008), false), None);
        assert_eq!(rule.check(6, &iv(0.992, 1.008), true), None);
        // Narrow but straddling the floor: more pairs, until the budget.
        assert_eq!(rule.check(10, &iv(0.945, 0.96), false), None);
        assert_eq!(
            rule.check(20, &iv(0.945, 0.96), false),
            Some(Stop::PairBudget)
        );
        assert_eq!(rule.check(12, &iv(0.9, 1.1), true), Some(Stop::TimeBudget));
        assert_eq!(verdict(&iv(0.945, 0.96), 0.95), "infra:inconclusive");
        assert_eq!(verdict(&iv(0.90, 0.949), 0.95), "below_floor");
        assert_eq!(verdict(&iv(0.95, 1.2), 0.95), "passed");
        // A fixed number of pairs stops there, and straddling then means inconclusive.
        let fixed = Rule {
            target_half_width: None,
            max_pairs: 8,
            ..rule
        };
        assert_eq!(fixed.check(7, &iv(0.9, 1.1), false), None);
        assert_eq!(fixed.check(8, &iv(0.96, 1.1), false), Some(Stop::PairsDone));
        assert_eq!(fixed.check(8, &iv(0.9, 1.1), false), Some(Stop::PairBudget));
    }

    #[test]
    fn scores_are_ratios_of_whole_windows() {
        let f = |w: f64| Figures { window_seconds: w };
        let pairs = [PairFigures {
            baseline: f(4.0),
            candidate: f(1.0),
            noop: Some(f(2.0)),
        }];
        let c = score(Track::Dflash, &pairs, &[0]);
        assert_eq!((c.score, c.raw, c.noop), (2.0, Some(4.0), Some(2.0)));
        let c = score(Track::Serial, &pairs, &[0]);
        assert_eq!((c.score, c.raw, c.noop), (4.0, None, None));
    }
}
