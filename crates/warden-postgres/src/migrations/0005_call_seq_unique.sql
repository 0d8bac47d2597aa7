-- Warden schema, version 5: a call's `seq` is unique within its session.
--
-- Applied after version 4, inside the same kind of transaction (migration
-- advisory lock held, `search_path` set to the schema). The index that
-- reads calls back by `seq` becomes a unique one. Every engine wrote each
-- new call at the session's call count under the session's compare-and-set,
-- so a database it wrote holds no two calls at one `seq`; one that does
-- fails this migration, which then changes nothing.
DROP INDEX session_calls_by_seq;
CREATE UNIQUE INDEX session_calls_by_seq ON session_calls (session_id, seq);
