-- Warden schema, version 7: a session's source index in parts.
--
-- Applied after version 6, inside the same kind of transaction (migration
-- advisory lock held, `search_path` set to the schema). The index leaves
-- the session row for parts of its own, keyed by the revision that wrote
-- them: the create writes the first, a recorded result appends its delta,
-- a replace drops the parts and writes one. The index is the parts'
-- bytes in revision order, so recording a result writes its delta, not
-- the whole index again. Every stored index becomes the one part of its
-- session's revision.
CREATE TABLE session_index (
    session_id TEXT NOT NULL REFERENCES sessions (session_id),
    revision   BIGINT NOT NULL CHECK (revision >= 1),
    bytes      BYTEA NOT NULL,
    PRIMARY KEY (session_id, revision)
);
INSERT INTO session_index (session_id, revision, bytes)
SELECT session_id, revision, sources FROM sessions;
ALTER TABLE sessions DROP COLUMN sources;
