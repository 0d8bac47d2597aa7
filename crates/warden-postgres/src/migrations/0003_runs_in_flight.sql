-- Warden schema, version 3: runs in flight.
--
-- Applied after version 2, inside the same kind of transaction (migration
-- advisory lock held, `search_path` set to the schema). `finished_at` is
-- set once, in the transaction that records the step which finishes the
-- run (a step that did not complete, or the last step without an outcome),
-- so `create_run` counts an agent's unfinished runs in its own
-- transaction. Runs finished before the migration are marked here.

ALTER TABLE runs ADD COLUMN finished_at BIGINT;

UPDATE runs SET finished_at = coalesce(
    (SELECT max(recorded_at) FROM run_steps s WHERE s.run_id = runs.run_id),
    created_at)
WHERE EXISTS (SELECT 1 FROM run_steps s
              WHERE s.run_id = runs.run_id AND s.status IN ('failed', 'denied'))
   OR NOT EXISTS (SELECT 1 FROM run_steps s
                  WHERE s.run_id = runs.run_id AND s.status IS NULL);

CREATE INDEX runs_in_flight ON runs (agent, created_at) WHERE finished_at IS NULL;
