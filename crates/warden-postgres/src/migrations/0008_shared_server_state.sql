-- Warden schema, version 8: state servers sharing the database share:
-- request-rate buckets and envelope signing keys.
--
-- Applied after version 7, inside the same kind of transaction (migration
-- advisory lock held, `search_path` set to the schema).

-- One token bucket per key (`agent:ID`, `tree:ID`): milli-tokens held and
-- when it was last charged (ms since the epoch).
CREATE TABLE request_buckets (
    bucket       TEXT PRIMARY KEY,
    milli_tokens BIGINT NOT NULL,
    updated_ms   BIGINT NOT NULL
);

-- Charge one request to every bucket named, or to none, in one statement:
-- the token-bucket rule of `warden_store::rates::take_tokens`, step for
-- step in BIGINT. Every row is created (full) or locked by the first
-- statement, in key order, so concurrent takers (on any server) queue on
-- the rows they share and never deadlock; the second writes the refilled
-- states (less one token each when every bucket had one). Returns the
-- refusing bucket's index (0-based; NULL when taken) and its wait in ms.
CREATE FUNCTION take_request_tokens(
    p_buckets TEXT[],
    p_rates   BIGINT[],
    p_bursts  BIGINT[],
    p_now     BIGINT
) RETURNS TABLE (refused INTEGER, retry_after_ms BIGINT)
LANGUAGE plpgsql AS $$
DECLARE
    n          INTEGER := coalesce(cardinality(p_buckets), 0);
    toks       BIGINT[] := '{}';
    stamps     BIGINT[] := '{}';
    t          BIGINT;
    l          BIGINT;
    r          BIGINT;
    cap        BIGINT;
    wait       BIGINT;
    worst      INTEGER := NULL;
    worst_wait BIGINT := 0;
BEGIN
    INSERT INTO request_buckets AS b (bucket, milli_tokens, updated_ms)
        SELECT c.k, greatest(c.burst, 1) * 1000, p_now
        FROM unnest(p_buckets, p_bursts) AS c(k, burst)
        ORDER BY c.k
    ON CONFLICT (bucket) DO UPDATE SET bucket = b.bucket;
    FOR i IN 1..n LOOP
        SELECT b.milli_tokens, b.updated_ms INTO t, l
            FROM request_buckets b WHERE b.bucket = p_buckets[i];
        r := greatest(p_rates[i], 1);
        cap := greatest(p_bursts[i], 1) * 1000;
        IF t < cap THEN
            t := least(t + least(greatest(p_now - l, 0), (cap - t + r - 1) / r) * r, cap);
        END IF;
        t := least(t, cap);
        l := greatest(l, p_now);
        IF t < 1000 THEN
            wait := (1000 - t + r - 1) / r;
            IF worst IS NULL OR wait > worst_wait THEN
                worst := i;
                worst_wait := wait;
            END IF;
        END IF;
        toks := toks || t;
        stamps := stamps || l;
    END LOOP;
    UPDATE request_buckets b
        SET milli_tokens = c.t - CASE WHEN worst IS NULL THEN 1000 ELSE 0 END,
            updated_ms = c.l
        FROM unnest(p_buckets, toks, stamps) AS c(k, t, l)
        WHERE b.bucket = c.k;
    RETURN QUERY SELECT worst - 1, CASE WHEN worst IS NULL THEN 0 ELSE worst_wait END;
END
$$;

-- Envelope signing keys by generation (1, 2, …; the highest is current).
-- Written once each (create-only), never changed: the seed is stored as
-- it is, so whoever can read this table can sign envelopes.
CREATE TABLE envelope_signing_keys (
    generation BIGINT PRIMARY KEY CHECK (generation >= 1),
    seed       BYTEA NOT NULL CHECK (length(seed) = 32),
    public_key BYTEA NOT NULL CHECK (length(public_key) = 32),
    created_at BIGINT NOT NULL
);
