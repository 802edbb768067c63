-- Whose failure it is, for the daily cap (issue 42). A failure of the infrastructure that the
-- candidate's own process caused (its worker crashed, hung, broke the protocol), as its runner
-- reported it: such failures count against the cap beyond the track's free allowance
-- (`caps.free_infra_per_day`). 1 or 0.
ALTER TABLE submissions ADD COLUMN candidate_caused BIGINT NOT NULL DEFAULT 0;
-- The daily cap's count: a solver's submissions on a track.
CREATE INDEX submissions_by_solver ON submissions (solver, track, created_ms);
