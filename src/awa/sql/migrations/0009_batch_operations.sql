-- Durable batch operations: an operator's change to many queued jobs at once (set their
-- priority, move them to another queue), recorded here when submitted and carried out by
-- the maintenance leader in bounded steps, so that it survives restarts and failover,
-- reports its progress and can be cancelled half-way.
--
-- The leader scans awa.jobs by id up to the largest id at submission, a page per step,
-- writing the ids of the matching available and scheduled jobs to batch_operation_items
-- (the operation's snapshot); then it changes those jobs a chunk per step, deleting their
-- items as it goes (only pending items are stored; the counts are on the operation). Items
-- a cancelled or failed operation never reached are dropped while the leader is idle.

CREATE TABLE awa.batch_operations (
    id uuid PRIMARY KEY,
    op_kind text NOT NULL,
    filter jsonb NOT NULL,
    spec jsonb NOT NULL,
    state text NOT NULL DEFAULT 'pending',
    submitted_by text,
    submitted_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    started_at timestamptz,
    finalized_at timestamptz,
    -- {"after_job_id": the last id scanned, "max_job_id": the largest id at submission}.
    cursor jsonb,
    -- Jobs the scan matched (NULL until the scan ends; counted up while it runs).
    total_matched bigint,
    processed bigint NOT NULL DEFAULT 0,
    skipped bigint NOT NULL DEFAULT 0,
    errored bigint NOT NULL DEFAULT 0,
    last_error text,
    runner_instance uuid,
    retention_until timestamptz,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT batch_operations_op_kind CHECK (op_kind IN ('set_priority', 'move_queue')),
    CONSTRAINT batch_operations_state CHECK (
        state IN ('pending', 'scanning', 'running', 'cancelling', 'completed', 'cancelled',
                  'failed')
    ),
    CONSTRAINT batch_operations_submitted_by_length
        CHECK (submitted_by IS NULL OR length(submitted_by) <= 200)
);

-- The leader's next operation: the active ones, oldest first.
CREATE INDEX batch_operations_active_idx ON awa.batch_operations (submitted_at, id)
    WHERE state IN ('pending', 'scanning', 'running', 'cancelling');

-- Listing, newest first.
CREATE INDEX batch_operations_submitted_idx ON awa.batch_operations (submitted_at);

-- Retention of finished operations.
CREATE INDEX batch_operations_retention_idx ON awa.batch_operations (retention_until)
    WHERE retention_until IS NOT NULL;

-- The jobs an operation matched and has not yet changed or skipped.
CREATE TABLE awa.batch_operation_items (
    operation_id uuid NOT NULL REFERENCES awa.batch_operations (id) ON DELETE CASCADE,
    job_id bigint NOT NULL,
    PRIMARY KEY (operation_id, job_id)
);
