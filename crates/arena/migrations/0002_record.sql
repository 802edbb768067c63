-- The public record. An operator can mark a submission as a cheat: it leaves the ranking, its
-- page and its evidence stay (the reason is shown on it). NULL: not marked.
ALTER TABLE submissions ADD COLUMN cheat_reason TEXT;
ALTER TABLE submissions ADD COLUMN cheat_ms BIGINT;
CREATE INDEX submissions_by_track ON submissions (track, created_ms);
