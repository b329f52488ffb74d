-- Worker runtimes: which queues each live worker process runs. Health reports a queue whose
-- jobs wait while no live runtime runs it (unserved), and the operator UI lists workers.
--
-- A runtime inserts its row at start, refreshes heartbeat_at with its job heartbeats and
-- deletes the row on a clean shutdown. A row whose heartbeat is older than its own
-- stale_after is a dead process: readers ignore it and the maintenance leader deletes it.

CREATE TABLE awa.runtimes (
    id uuid PRIMARY KEY,
    hostname text NOT NULL,
    pid integer NOT NULL,
    application_name text NOT NULL,
    version text NOT NULL,
    queues text[] NOT NULL,
    -- Handlers each queue runs at once, e.g. {"email": 4}.
    concurrency jsonb NOT NULL DEFAULT '{}',
    is_leader boolean NOT NULL DEFAULT false,
    started_at timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    stale_after interval NOT NULL
);
