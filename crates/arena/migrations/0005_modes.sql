-- What a submission is for (issue 49): `test` (ends after the gate), `benchmark` (priced, never
-- promoted or ranked) or `leaderboard` (every submission made before modes existed). The first
-- two are private runs: only their solver sees them, they have their own daily quota
-- (`caps.private_runs_per_day`) and runners lease them after the leaderboard's jobs.
ALTER TABLE submissions ADD COLUMN mode TEXT NOT NULL DEFAULT 'leaderboard';
-- The private quota's count: a solver's private runs on a track.
CREATE INDEX submissions_by_mode ON submissions (solver, track, mode, created_ms);
