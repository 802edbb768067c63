-- A `profile` run's profile (issue 49): the candidate's per-op times and, on a CUDA track, its
-- per-kernel timeline, as the runner parsed and bounded them from what the candidate's build
-- printed and the service checked them again (`profile::Profile` as JSON). One row per profile
-- run, its solver's only: nothing that prices, ranks, promotes or draws a public page reads it.
CREATE TABLE profiles (
    submission TEXT PRIMARY KEY,
    profile TEXT NOT NULL,
    created_ms BIGINT NOT NULL
);
