-- The arena's schema: one file for SQLite and PostgreSQL alike, so only portable SQL here
-- (TEXT, BIGINT, DOUBLE PRECISION; ids made by the service, times as Unix milliseconds).

-- Solvers and runners authenticate with `<id>.<secret>` bearer tokens; only a hash of the
-- secret is stored.
CREATE TABLE solvers (
    id TEXT PRIMARY KEY,
    secret_hash TEXT NOT NULL,
    created_ms BIGINT NOT NULL
);

CREATE TABLE runners (
    id TEXT PRIMARY KEY,
    secret_hash TEXT NOT NULL,
    kind TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    last_seen_ms BIGINT
);

-- A submission is also its own job: `next_stage` is the first stage not yet finished and
-- `next_kind` the kind of runner that runs it; a lease (runner, id, expiry) marks it taken.
CREATE TABLE submissions (
    id TEXT PRIMARY KEY,
    solver TEXT NOT NULL,
    track TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    model TEXT,
    claimed_score DOUBLE PRECISION,
    note TEXT NOT NULL,
    bundle_digest TEXT NOT NULL,
    base_commit TEXT NOT NULL,
    reprice_of TEXT,
    created_ms BIGINT NOT NULL,
    status TEXT NOT NULL,
    next_stage TEXT,
    next_kind TEXT,
    lease_runner TEXT,
    lease_id TEXT,
    lease_expires_ms BIGINT,
    category TEXT,
    attributable BIGINT NOT NULL DEFAULT 0,
    score DOUBLE PRECISION,
    verdict TEXT,
    finished_ms BIGINT,
    UNIQUE (solver, idempotency_key)
);
CREATE INDEX submissions_queue ON submissions (next_kind, created_ms);

-- Every attempt at a stage: who ran it, when, how it ended, what the public may see (`detail`)
-- and what later stages need (`result`, never published).
CREATE TABLE stages (
    id TEXT PRIMARY KEY,
    submission TEXT NOT NULL,
    stage TEXT NOT NULL,
    runner TEXT,
    started_ms BIGINT NOT NULL,
    ended_ms BIGINT,
    outcome TEXT,
    detail TEXT,
    result TEXT
);
CREATE INDEX stages_of_submission ON stages (submission, started_ms);

-- Built binaries by content: the key is the digest of (tree commit, bundle digest, build
-- recipe); the artifact is the binary's sha256 in the service's artifact store.
CREATE TABLE builds (
    build_key TEXT PRIMARY KEY,
    artifact TEXT NOT NULL,
    created_ms BIGINT NOT NULL
);

-- A track's bases: the pinned baseline first (seq 0, from the track file), then each promotion.
CREATE TABLE promotions (
    track TEXT NOT NULL,
    seq BIGINT NOT NULL,
    submission TEXT,
    base_commit TEXT NOT NULL,
    score DOUBLE PRECISION NOT NULL,
    created_ms BIGINT NOT NULL,
    PRIMARY KEY (track, seq)
);
