-- Periodic jobs: cron schedules, evaluated by the maintenance leader.
--
-- Runtimes upsert the schedules their client declares when they start; a deployment never
-- deletes another's. Each fire moves last_enqueued_at with a compare-and-swap in the same
-- statement that inserts the job, so a fire is enqueued once across leader failover,
-- restarts and several deployments.

CREATE TABLE awa.cron_jobs (
    name text PRIMARY KEY,
    cron_expr text NOT NULL,
    timezone text NOT NULL DEFAULT 'UTC',
    kind text NOT NULL,
    queue text NOT NULL,
    args jsonb NOT NULL DEFAULT '{}',
    priority smallint NOT NULL DEFAULT 2,
    max_attempts smallint NOT NULL DEFAULT 25,
    tags text[] NOT NULL DEFAULT '{}',
    metadata jsonb NOT NULL DEFAULT '{}',
    missed_fire_policy text NOT NULL DEFAULT 'coalesce',
    -- The last fire enqueued (NULL: none yet; fires are counted from created_at).
    last_enqueued_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    paused_at timestamptz,
    paused_by text,
    CONSTRAINT cron_jobs_name_length CHECK (length(name) BETWEEN 1 AND 200),
    CONSTRAINT cron_jobs_policy CHECK (missed_fire_policy IN ('coalesce', 'catch_up')),
    CONSTRAINT cron_jobs_priority CHECK (priority BETWEEN 1 AND 4),
    CONSTRAINT cron_jobs_max_attempts CHECK (max_attempts BETWEEN 1 AND 1000)
);
