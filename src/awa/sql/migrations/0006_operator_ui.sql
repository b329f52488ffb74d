-- What the operator UI reads on large tables.

-- The follow-ups of a job: a follow-up records its trigger in metadata->'awa:trigger'
-- (id, kind, outcome, via). Only follow-ups are in this index.
CREATE INDEX jobs_trigger_idx ON awa.jobs (((metadata -> 'awa:trigger' ->> 'id')::bigint))
    WHERE metadata ? 'awa:trigger';

-- Failed and cancelled jobs, newest first: a list filtered on either state and the failed
-- jobs grouped by error would otherwise read the whole table past its completed rows.
CREATE INDEX jobs_problem_idx ON awa.jobs (id) WHERE state IN ('failed', 'cancelled');

-- Throughput: the leader's sample also counts the jobs finished in the last hour by state.
ALTER TABLE awa.queue_samples ADD COLUMN finished_hour jsonb NOT NULL DEFAULT '{}';
