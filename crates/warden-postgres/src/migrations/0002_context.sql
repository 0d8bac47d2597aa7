-- Warden schema, version 2: context envelopes and the escalation queue.
--
-- Applied after version 1, inside the same kind of transaction (migration
-- advisory lock held, `search_path` set to the schema). Existing rows are
-- kept: agents and runs made before version 2 have no envelope (NULL).

-- The envelope an agent inherited when it was delegated.
ALTER TABLE agents ADD COLUMN envelope_id TEXT;

-- A run's context envelope.
ALTER TABLE runs ADD COLUMN envelope_id TEXT;

-- Every version of every envelope: receipts name `(envelope_id, version)`,
-- so no version is ever replaced or deleted. `record` is the envelope as
-- the exact text serde_json writes.
CREATE TABLE envelopes (
    envelope_id TEXT NOT NULL,
    version     BIGINT NOT NULL CHECK (version >= 0),
    record      TEXT NOT NULL,
    PRIMARY KEY (envelope_id, version)
);

-- The latest version of each envelope: the row every compare-and-set on an
-- envelope decides against. Creating an envelope inserts its row (a second
-- creator finds it and conflicts); a new version updates it with
-- `WHERE version = <expected> AND <new> > <expected>` (zero rows: a
-- conflict), in the same transaction as the version's row.
CREATE TABLE envelope_heads (
    envelope_id TEXT PRIMARY KEY,
    version     BIGINT NOT NULL CHECK (version >= 0)
);

-- Requests held for human review. `target` is the canonical JSON of what
-- the escalation holds up; `ord` gives the creation order.
CREATE TABLE escalations (
    ord              BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
    escalation_id    TEXT PRIMARY KEY,
    target           TEXT NOT NULL,
    requested_by     TEXT NOT NULL,
    operation        TEXT NOT NULL,
    resource         TEXT NOT NULL,
    reason           TEXT NOT NULL,
    envelope_id      TEXT,
    envelope_version BIGINT CHECK (envelope_version >= 0),
    classification   TEXT NOT NULL,
    obligations      TEXT NOT NULL,
    status           TEXT NOT NULL
        CHECK (status IN ('pending', 'approved', 'rejected', 'consumed')),
    created_at       BIGINT NOT NULL,
    resolved_by      TEXT,
    resolved_at      BIGINT,
    rejection_reason TEXT,
    consumed_at      BIGINT,
    -- Resolved (approved, rejected, consumed) exactly when it says by whom
    -- and when; only a rejection has a reason; only a consumption a time.
    CHECK ((status = 'pending') = (resolved_by IS NULL)),
    CHECK ((resolved_by IS NULL) = (resolved_at IS NULL)),
    CHECK ((status = 'rejected') = (rejection_reason IS NOT NULL)),
    CHECK ((status = 'consumed') = (consumed_at IS NOT NULL))
);

-- At most one open (pending or approved) escalation per target, across
-- every server: a second request for the same target finds the open one.
CREATE UNIQUE INDEX escalations_one_open_per_target ON escalations (target)
    WHERE status IN ('pending', 'approved');

CREATE INDEX escalations_by_status ON escalations (status, ord);

-- Pending -> approved | rejected; approved -> consumed; nothing else, and
-- what an escalation was about never changes. Warden's statements only
-- make these transitions; the trigger stops anything else (a bug, a manual
-- edit through a role that cannot drop triggers).
CREATE FUNCTION warden_escalation_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT ((OLD.status = 'pending' AND NEW.status IN ('approved', 'rejected'))
            OR (OLD.status = 'approved' AND NEW.status = 'consumed')) THEN
        RAISE EXCEPTION 'escalation % cannot go from % to %',
            OLD.escalation_id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    IF (NEW.escalation_id, NEW.target, NEW.requested_by, NEW.operation, NEW.resource,
        NEW.reason, NEW.envelope_id, NEW.envelope_version, NEW.classification,
        NEW.obligations, NEW.created_at)
       IS DISTINCT FROM
       (OLD.escalation_id, OLD.target, OLD.requested_by, OLD.operation, OLD.resource,
        OLD.reason, OLD.envelope_id, OLD.envelope_version, OLD.classification,
        OLD.obligations, OLD.created_at) THEN
        RAISE EXCEPTION 'escalation %: only its status and resolution change',
            OLD.escalation_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER escalations_transition BEFORE UPDATE ON escalations
    FOR EACH ROW EXECUTE FUNCTION warden_escalation_transition();
CREATE FUNCTION warden_escalation_no_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'warden escalations are never deleted'
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER escalations_no_delete BEFORE DELETE ON escalations
    FOR EACH ROW EXECUTE FUNCTION warden_escalation_no_delete();

-- Envelope versions are immutable once written (a receipt names one).
CREATE FUNCTION warden_envelope_versions_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'warden envelope versions are never changed or deleted'
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER envelopes_immutable BEFORE UPDATE OR DELETE ON envelopes
    FOR EACH ROW EXECUTE FUNCTION warden_envelope_versions_immutable();
