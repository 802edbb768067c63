//! The daily cap on a solver's failures per track (`caps.failures_per_day`): what counts against
//! it. Counted are the solver's attributable failures of the last day (the candidate's fault:
//! policy, review, build, gate, price, violations), its candidate-caused infrastructure failures
//! of the last day beyond the track's free allowance (`caps.free_infra_per_day`: its worker
//! crashed, hung or broke the protocol, which a candidate can do at will), and its submissions
//! still queued or running (any of them may fail). Free: infrastructure failures the runner or
//! the reference caused, cancelled jobs, and the re-pricings the service queues itself.

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
         WHERE solver = $1 AND track = $2 AND ( \
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
}
