-- Warden schema, version 9: audit entries sealed inside the database.
--
-- Applied after version 8, inside the same kind of transaction (migration
-- advisory lock held, `search_path` set to the schema).

-- `n` as 8 bytes, little-endian (`int8send` writes big-endian).
CREATE FUNCTION warden_le8(n BIGINT) RETURNS BYTEA
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT int8send(((n & 255) << 56) | (((n >> 8) & 255) << 48)
        | (((n >> 16) & 255) << 40) | (((n >> 24) & 255) << 32)
        | (((n >> 32) & 255) << 24) | (((n >> 40) & 255) << 16)
        | (((n >> 48) & 255) << 8) | ((n >> 56) & 255))
$$;

-- Append a group of entries after whatever the head is when the head row
-- is locked, in one statement (run as its own transaction: the insert and
-- the head's update commit together or not at all). The caller sends each
-- entry's stored columns and its hash body (`warden_core::audit::entry_body`:
-- every field from `time` to `details`, length-prefixed); each entry's
-- position and hash are decided here: `seq` is the head's plus one, and
-- `hash = sha256(tag, le8(8), le8(seq), body, le8(32), prev_hash)`, exactly
-- `warden_core::audit::entry_hash` (the caller checks every hash returned
-- against its own). The head row's lock is held for this statement and the
-- commit only: no round trip between the server and the database is made
-- under it, and no server needs to know the head beforehand. Returns the
-- head before the group and, per entry, its sequence number and hash.
CREATE FUNCTION warden_append_sealed(
    p_times    BIGINT[],
    p_subjects TEXT[],
    p_ops      TEXT[],
    p_res      TEXT[],
    p_verdicts TEXT[],
    p_reasons  TEXT[],
    p_policies TEXT[],
    p_details  TEXT[],
    p_bodies   BYTEA[]
) RETURNS TABLE (base_seq BIGINT, base_hash BYTEA, seqs BIGINT[], hashes BYTEA[])
LANGUAGE plpgsql AS $$
DECLARE
    n      INTEGER := coalesce(cardinality(p_bodies), 0);
    s0     BIGINT;
    h0     BYTEA;
    s      BIGINT;
    h      BYTEA;
    ss     BIGINT[] := '{}';
    prevs  BYTEA[] := '{}';
    hs     BYTEA[] := '{}';
BEGIN
    SELECT a.seq, a.hash INTO s0, h0 FROM audit_head a FOR UPDATE;
    s := s0;
    h := h0;
    FOR i IN 1..n LOOP
        s := s + 1;
        prevs := prevs || h;
        h := sha256('\x77617264656e2e61756469742e763100'::bytea
            || '\x0800000000000000'::bytea || warden_le8(s) || p_bodies[i]
            || '\x2000000000000000'::bytea || h);
        ss := ss || s;
        hs := hs || h;
    END LOOP;
    IF n > 0 THEN
        INSERT INTO audit_log (seq, time, subject, operation, resource, verdict, reason,
            policy_version, details, prev_hash, hash)
        SELECT * FROM unnest(ss, p_times, p_subjects, p_ops, p_res, p_verdicts, p_reasons,
            p_policies, p_details, prevs, hs);
        UPDATE audit_head SET seq = s, hash = h;
    END IF;
    RETURN QUERY SELECT s0, h0, ss, hs;
END
$$;
