-- Warden schema, version 4: tool-call sessions.
--
-- Applied after version 3, inside the same kind of transaction (migration
-- advisory lock held, `search_path` set to the schema). Nothing existing
-- changes; a session's first envelope version goes into `envelopes` (and
-- `envelope_heads`) beside every other envelope.

-- One row per session, changed only by compare-and-set on `revision`
-- (`UPDATE ... WHERE session_id = $1 AND revision = $expected`). `record`
-- is the SessionRecord as the exact text serde_json writes (the other
-- columns repeat parts of it for lookups), `sources` the serialised source
-- index (keyed fingerprints, never tool output), `ord` the creation order.
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY,
    ord        BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
    agent      TEXT NOT NULL,
    revision   BIGINT NOT NULL CHECK (revision >= 1),
    created_at BIGINT NOT NULL,
    record     TEXT NOT NULL,
    sources    BYTEA NOT NULL
);
CREATE INDEX sessions_by_agent ON sessions (agent, ord);

-- The calls of each session, keyed by their id (a retried call replaces
-- its row), read back by `seq`.
CREATE TABLE session_calls (
    session_id TEXT NOT NULL REFERENCES sessions (session_id),
    call_id    TEXT NOT NULL,
    seq        BIGINT NOT NULL CHECK (seq >= 0),
    record     TEXT NOT NULL,
    PRIMARY KEY (session_id, call_id)
);
CREATE INDEX session_calls_by_seq ON session_calls (session_id, seq);

-- Every envelope a session was opened from. A create decides a new import
-- against the earlier ones of its (issuer, envelope_id), read after taking
-- a transaction-scoped advisory lock on that pair, so two servers
-- importing one envelope at once are decided one after the other.
CREATE TABLE envelope_imports (
    issuer      TEXT NOT NULL,
    envelope_id TEXT NOT NULL,
    version     BIGINT NOT NULL CHECK (version >= 0),
    record      TEXT NOT NULL,
    PRIMARY KEY (issuer, envelope_id, version)
);

-- A revision moves by one at a time and a session never changes its id;
-- sessions, their calls and the import notes are never deleted, and an
-- import note never changes.
CREATE FUNCTION warden_session_forward() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.revision IS DISTINCT FROM OLD.revision + 1
       OR NEW.session_id IS DISTINCT FROM OLD.session_id
       OR NEW.ord IS DISTINCT FROM OLD.ord THEN
        RAISE EXCEPTION 'session % changes one revision at a time', OLD.session_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER sessions_forward BEFORE UPDATE ON sessions
    FOR EACH ROW EXECUTE FUNCTION warden_session_forward();
CREATE FUNCTION warden_sessions_kept() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'warden sessions, their calls and envelope imports are kept'
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER sessions_no_delete BEFORE DELETE ON sessions
    FOR EACH ROW EXECUTE FUNCTION warden_sessions_kept();
CREATE TRIGGER session_calls_no_delete BEFORE DELETE ON session_calls
    FOR EACH ROW EXECUTE FUNCTION warden_sessions_kept();
CREATE TRIGGER envelope_imports_kept BEFORE UPDATE OR DELETE ON envelope_imports
    FOR EACH ROW EXECUTE FUNCTION warden_sessions_kept();
