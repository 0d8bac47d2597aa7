-- Warden schema, version 1.
--
-- Applied inside one transaction that holds the migration advisory lock, on
-- the schema named by `search_path`. JSON is stored as the exact text
-- serde_json writes (TEXT, not JSONB: JSONB rejects `\u0000` in strings and
-- renormalises numbers, and the audit hashes and the per-owner byte quota
-- need the exact text). Times are milliseconds since the Unix epoch (BIGINT).
-- Free-form strings use the codec's reversible NUL escape (see codec.rs).

CREATE TABLE warden_meta (
    singleton      BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    schema_version BIGINT NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE agents (
    ord          BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
    id           TEXT PRIMARY KEY,
    parent       TEXT,
    capabilities TEXT[] NOT NULL,
    tools        TEXT[] NOT NULL,
    config       TEXT,
    status       TEXT NOT NULL CHECK (status IN ('active', 'revoked')),
    created_at   BIGINT NOT NULL
);

CREATE TABLE tokens (
    token_id      TEXT PRIMARY KEY,
    hash          BYTEA NOT NULL UNIQUE CHECK (octet_length(hash) = 32),
    subject_kind  TEXT NOT NULL CHECK (subject_kind IN ('operator', 'agent')),
    subject_agent TEXT,
    created_at    BIGINT NOT NULL,
    revoked       BOOLEAN NOT NULL DEFAULT FALSE,
    CHECK ((subject_kind = 'agent') = (subject_agent IS NOT NULL))
);

CREATE TABLE memory (
    owner       TEXT NOT NULL,
    namespace   TEXT NOT NULL,
    key         TEXT NOT NULL,
    value       TEXT NOT NULL,
    value_bytes BIGINT GENERATED ALWAYS AS (octet_length(value)) STORED,
    visibility  TEXT NOT NULL CHECK (visibility IN ('private', 'children', 'descendants')),
    class       TEXT NOT NULL CHECK (class IN ('preference', 'policy', 'secret', 'task')),
    combine     TEXT CHECK (combine IN ('all', 'any', 'min', 'max', 'intersection')),
    grants      TEXT[],
    expires_at  BIGINT,
    revision    BIGINT NOT NULL CHECK (revision >= 1),
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL,
    PRIMARY KEY (owner, namespace, key),
    CHECK ((class = 'policy') = (combine IS NOT NULL)),
    CHECK ((class = 'secret') = (grants IS NOT NULL)),
    CHECK (class = 'task' OR expires_at IS NULL)
);

-- The decision log. `seq` is assigned while holding the `audit_head` row
-- lock, so entries from every server form one chain without gaps.
CREATE TABLE audit_log (
    seq            BIGINT PRIMARY KEY CHECK (seq >= 1),
    time           BIGINT NOT NULL,
    subject        TEXT NOT NULL,
    operation      TEXT NOT NULL,
    resource       TEXT NOT NULL,
    verdict        TEXT NOT NULL,
    reason         TEXT NOT NULL,
    policy_version TEXT NOT NULL,
    details        TEXT NOT NULL,
    prev_hash      BYTEA NOT NULL,
    hash           BYTEA NOT NULL
);

-- The chain's head: one row, locked (SELECT ... FOR UPDATE) by every
-- transaction that appends to the log or records a change. Its lock defines
-- the one total order of the log; it is updated in the same transaction as
-- every append, so a truncated tail is detected.
CREATE TABLE audit_head (
    singleton BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    seq       BIGINT NOT NULL CHECK (seq >= 0),
    hash      BYTEA NOT NULL CHECK (octet_length(hash) = 32)
);
INSERT INTO audit_head (seq, hash) VALUES (0, decode(repeat('00', 32), 'hex'));

-- Append-only: Warden never updates or deletes log entries or rewinds the
-- head. This stops mistakes and application bugs, not the owner of the
-- database (who can drop the trigger): the hash chain and an external head
-- anchor detect that.
CREATE FUNCTION warden_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the warden audit log is append-only'
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION warden_audit_append_only();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION warden_audit_append_only();

CREATE TABLE runs (
    run_id         TEXT PRIMARY KEY,
    agent          TEXT NOT NULL,
    sop_hash       BYTEA NOT NULL CHECK (octet_length(sop_hash) = 32),
    sop            TEXT NOT NULL,
    policy_version TEXT NOT NULL,
    created_at     BIGINT NOT NULL
);

-- One row per step of a run; the outcome columns are set exactly once
-- (`UPDATE ... WHERE status IS NULL`).
CREATE TABLE run_steps (
    run_id       TEXT NOT NULL REFERENCES runs (run_id),
    ord          INTEGER NOT NULL,
    step_id      TEXT NOT NULL,
    action       TEXT NOT NULL,
    operation_id TEXT NOT NULL,
    status       TEXT CHECK (status IN ('completed', 'failed', 'denied')),
    result       TEXT,
    error        TEXT,
    labels       TEXT[],
    recorded_at  BIGINT,
    PRIMARY KEY (run_id, step_id),
    UNIQUE (run_id, ord),
    CHECK ((status IS NULL) = (recorded_at IS NULL))
);

-- Changes to agents and tokens, for other servers' caches. `seq` is
-- assigned as max + 1 while holding the `audit_head` lock, so sequence
-- numbers become visible in commit order without gaps.
CREATE TABLE changes (
    seq        BIGINT PRIMARY KEY CHECK (seq >= 1),
    kind       TEXT NOT NULL,
    ids        TEXT[] NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
