-- Warden schema, version 6: approvals bound to the request reviewed, and
-- leases on client-executed steps.
--
-- Applied after version 5, inside the same kind of transaction (migration
-- advisory lock held, `search_path` set to the schema).
--
-- `escalations.request` holds the request the reviewer is shown (canonical
-- JSON); its digest is part of `target`. Rows written before have none:
-- their target carries no digest, so no request matches them.
ALTER TABLE escalations ADD COLUMN request TEXT;
-- A client-executed step that has begun and not completed is leased to one
-- holder from `lease_acquired_at` until `lease_expires_at` (ms since the
-- epoch); all three are set or none is.
ALTER TABLE run_steps ADD COLUMN lease_holder TEXT;
ALTER TABLE run_steps ADD COLUMN lease_acquired_at BIGINT;
ALTER TABLE run_steps ADD COLUMN lease_expires_at BIGINT;
ALTER TABLE run_steps ADD CONSTRAINT run_steps_lease_whole
    CHECK ((lease_holder IS NULL) = (lease_expires_at IS NULL)
       AND (lease_holder IS NULL) = (lease_acquired_at IS NULL));
