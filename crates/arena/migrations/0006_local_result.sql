-- The transfer ledger (issue 49): a solver's own pricing of its change (`submit --local-result`),
-- as the API checked it (`api::LocalResult` as JSON: score, ci95, pairs, clock track, machine),
-- kept beside the arena's score. Solver-supplied: nothing that ranks, promotes or prices reads it.
ALTER TABLE submissions ADD COLUMN local_result TEXT;
