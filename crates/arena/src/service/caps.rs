//! The daily cap on a solver's failures per track (`caps.failures_per_day`): what counts against
//! it. Counted are the solver's attributable failures of the last day (the candidate's fault:
//! policy, review, build, gate, price, violations), its candidate-caused infrastructure failures
//! of the last day beyond the track's free allowance (`caps.free_infra_per_day`: its worker
//! crashed, hung or broke the protocol, which a candidate can do at will), and its submissions
//! still queued or running (any of them may fail). Free: infrastructure failures the runner or
//! the reference caused, cancelled jobs, and the re-pricings the service queues itself. Private
//! runs (`test`, `benchmark`, `profile`) are not counted here: they have their own quota
//! (`caps.private_runs_per_day`, `PrivateRuns`), which leaderboard submissions never draw on.

use anyhow::Result;
use sqlx::Row;

use crate::service::db::Backend;
use crate::track::Track;

/// A day, in milliseconds: how long a failure counts.
pub const DAY_MS: i64 = 86_400_000;

/// Seconds a solver is told to wait when only its unfinished submissions fill the cap (one of
/// them finishing, or passing, frees a place).
pub const IN_FLIGHT_RETRY_S: u64 = 60;

/// The category of a job an operator cancelled (`fastdecode arena admin cancel`).
pub const CANCELLED: &str = "cancelled";

/// Whose a failure is, for the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blame {
    /// The solver's change: counts.
    Solver,
    /// An infrastructure failure the candidate's own process caused: counts beyond the free
    /// allowance.
    Candidate,
    /// The runner's, the reference's or an operator's: never counts.
    Free,
}

impl Blame {
    /// Of a failure `category`, as its runner reported it (`candidate_caused`).
    pub fn of(category: &str, candidate_caused: bool) -> Blame {
        if category == CANCELLED {
            Blame::Free
        } else if !category.starts_with("infra:") {
            Blame::Solver
        } else if candidate_caused {
            Blame::Candidate
        } else {
            Blame::Free
        }
    }
}

/// What counts against one solver's cap on one track now.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    /// Attributable failures of the last day.
    pub failures: i64,
    /// Candidate-caused infrastructure failures of the last day (free up to `free_infra`).
    pub infra: i64,
    pub free_infra: i64,
    /// Submissions queued or running.
    pub in_flight: i64,
    /// When each finished failure above was judged, oldest first, and whether it was
    /// attributable (else candidate-caused infra).
    finished: Vec<(i64, bool)>,
}

impl Usage {
    /// How many count against the cap.
    pub fn counted(&self) -> i64 {
        self.failures + (self.infra - self.free_infra).max(0) + self.in_flight
    }

    /// Seconds until fewer than `cap` count as the finished failures age out, if that alone
    /// gets there (else only an unfinished submission's end can).
    pub fn retry_after(&self, cap: i64, now: i64) -> Option<u64> {
        let mut left = self.clone();
        for &(at, attributable) in &self.finished {
            if attributable {
                left.failures -= 1;
            } else {
                left.infra -= 1;
            }
            if left.counted() < cap {
                return Some(((at + DAY_MS - now) / 1000).max(1) as u64);
            }
        }
        None
    }

    /// What was counted, in words.
    pub fn describe(&self) -> String {
        format!(
            "{} failure(s) in the last day, {} candidate-caused infra failure(s) beyond the {} \
             free a day ({} in all), {} submission(s) queued or running",
            self.failures,
            (self.infra - self.free_infra).max(0),
            self.free_infra,
            self.infra,
            self.in_flight
        )
    }
}

/// Locks `solver`'s row until the transaction ends, so that two of its submissions at once are
/// counted one after the other (on SQLite the write transaction already holds the database).
pub async fn lock_solver(
    tx: &mut sqlx::AnyConnection,
    backend: Backend,
    solver: &str,
) -> Result<()> {
    if backend == Backend::Postgres {
        sqlx::query("SELECT id FROM solvers WHERE id = $1 FOR UPDATE")
            .bind(solver)
            .fetch_optional(&mut *tx)
            .await?;
    }
    Ok(())
}

/// What counts against `solver`'s cap on `track` at `now`.
pub async fn usage(
    conn: &mut sqlx::AnyConnection,
    solver: &str,
    track: &Track,
    now: i64,
) -> Result<Usage> {
    let rows = sqlx::query(
        "SELECT status, attributable, finished_ms FROM submissions \
         WHERE solver = $1 AND track = $2 AND mode = 'leaderboard' AND ( \
           (status IN ('queued', 'running') AND reprice_of IS NULL) \
           OR (finished_ms > $3 AND (attributable = 1 OR candidate_caused = 1))) \
         ORDER BY finished_ms",
    )
    .bind(solver)
    .bind(&track.name)
    .bind(now - DAY_MS)
    .fetch_all(&mut *conn)
    .await?;
    let mut u = Usage {
        free_infra: i64::from(track.caps.free_infra_per_day),
        ..Usage::default()
    };
    for r in rows {
        let status: String = r.try_get("status")?;
        let finished: Option<i64> = r.try_get("finished_ms")?;
        let attributable = r.try_get::<i64, _>("attributable")? == 1;
        match finished {
            Some(at) if !matches!(status.as_str(), "queued" | "running") => {
                if attributable {
                    u.failures += 1;
                } else {
                    u.infra += 1;
                }
                u.finished.push((at, attributable));
            }
            _ => u.in_flight += 1,
        }
    }
    u.finished.sort_by_key(|f| f.0);
    Ok(u)
}

/// A solver's private runs (`test`, `benchmark`, `profile`) on a track in the last day, against the
/// track's own quota (`caps.private_runs_per_day`): each counts from its start, whatever its
/// outcome, for a day. Leaderboard submissions never count here, nor private runs there.
#[derive(Debug, Clone, PartialEq)]
pub struct PrivateRuns {
    /// When each was submitted, oldest first.
    pub created: Vec<i64>,
}

impl PrivateRuns {
    /// Seconds until fewer than `quota` count (the oldest ones aging out), if any are too many.
    pub fn retry_after(&self, quota: i64, now: i64) -> Option<u64> {
        let over = self.created.len() as i64 - quota;
        if over < 0 {
            return None;
        }
        // The run that must age out is the `over`-th oldest (from 0); with a quota of 0 none
        // ever will.
        let at = *self.created.get(over as usize).filter(|_| quota > 0)?;
        Some(((at + DAY_MS - now) / 1000).max(1) as u64)
    }
}

/// `solver`'s private runs on `track` in the day before `now`.
pub async fn private_runs(
    conn: &mut sqlx::AnyConnection,
    solver: &str,
    track: &Track,
    now: i64,
) -> Result<PrivateRuns> {
    let rows = sqlx::query(
        "SELECT created_ms FROM submissions WHERE solver = $1 AND track = $2 \
         AND mode <> 'leaderboard' AND created_ms > $3 ORDER BY created_ms",
    )
    .bind(solver)
    .bind(&track.name)
    .bind(now - DAY_MS)
    .fetch_all(&mut *conn)
    .await?;
    Ok(PrivateRuns {
        created: rows
            .iter()
            .map(|r| r.try_get("created_ms"))
            .collect::<Result<_, _>>()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(finished: &[(i64, bool)], in_flight: i64) -> Usage {
        Usage {
            failures: finished.iter().filter(|f| f.1).count() as i64,
            infra: finished.iter().filter(|f| !f.1).count() as i64,
            free_infra: 2,
            in_flight,
            finished: finished.to_vec(),
        }
    }

    #[test]
    fn only_the_candidates_own_infra_failures_count_and_only_beyond_the_allowance() {
        assert_eq!(Blame::of("gate:fidelity_divergence", false), Blame::Solver);
        assert_eq!(Blame::of("violation:kv_ledger", true), Blame::Solver);
        assert_eq!(Blame::of("infra:worker_crashed", true), Blame::Candidate);
        assert_eq!(Blame::of("infra:worker_crashed", false), Blame::Free);
        assert_eq!(Blame::of("infra:runner", false), Blame::Free);
        assert_eq!(Blame::of(CANCELLED, true), Blame::Free);
        // Two candidate-caused infra failures are free, the third counts; unfinished ones count.
        assert_eq!(usage(&[(1, false), (2, false)], 0).counted(), 0);
        assert_eq!(usage(&[(1, false), (2, false), (3, false)], 0).counted(), 1);
        assert_eq!(usage(&[(1, true), (2, false), (3, false)], 2).counted(), 3);
    }

    #[test]
    fn the_retry_time_is_when_enough_failures_have_aged_out() {
        let now = 10 * DAY_MS;
        let day_ago = now - DAY_MS;
        // Cap 2: [infra, infra, infra, attributable] count 2; the oldest infra aging out leaves
        // 1 + 0 = 1, so the first expiry is the answer.
        let u = usage(
            &[
                (day_ago + 5_000, false),
                (day_ago + 9_000, false),
                (day_ago + 20_000, false),
                (day_ago + 30_000, true),
            ],
            0,
        );
        assert_eq!(u.counted(), 2);
        assert_eq!(u.retry_after(2, now), Some(5));
        // Two infra failures within the allowance: their aging out frees nothing; the
        // attributable one's does.
        let u = usage(&[(day_ago + 5_000, false), (day_ago + 30_000, true)], 1);
        assert_eq!(u.retry_after(2, now), Some(30));
        // Only unfinished submissions fill it: no time will do.
        assert_eq!(usage(&[], 3).retry_after(3, now), None);
        let d = usage(&[(1, true), (2, false), (3, false), (4, false)], 2).describe();
        assert_eq!(
            d,
            "1 failure(s) in the last day, 1 candidate-caused infra failure(s) beyond the 2 free \
             a day (3 in all), 2 submission(s) queued or running"
        );
    }

    #[test]
    fn the_private_quota_frees_a_place_when_its_oldest_run_ages_out() {
        let now = 10 * DAY_MS;
        let day_ago = now - DAY_MS;
        let runs = |c: &[i64]| PrivateRuns {
            created: c.to_vec(),
        };
        // Under the quota: nothing to wait for.
        assert_eq!(runs(&[day_ago + 5_000]).retry_after(2, now), None);
        // At it: the oldest run's aging out frees one place.
        let full = runs(&[day_ago + 5_000, day_ago + 9_000]);
        assert_eq!(full.retry_after(2, now), Some(5));
        // Over it (the quota lowered since): as many must age out as are over, plus one.
        let over = runs(&[day_ago + 5_000, day_ago + 9_000, day_ago + 20_000]);
        assert_eq!(over.retry_after(1, now), Some(20));
        // A quota of 0: no private runs on the track, ever.
        assert_eq!(runs(&[]).retry_after(0, now), None);
    }
}
