-- Dead-letter queue: a job of a queue with the DLQ turned on that fails for good leaves
-- awa.jobs for awa.dlq_entries, where operators list, retry or purge it. The move happens in
-- the statement that fails the job, so a crash can neither lose it nor leave it in both.
--
-- Why a trigger (jobs_dlq_move below) rather than a move written into each failing path:
-- five statements fail a job (the last attempt failed or asked to retry, a terminal failure
-- or an unknown kind, WaitForCallback without a callback, a rescue of the last attempt, a
-- callback answered with fail), run by workers, the maintenance leader, clients and admin
-- code alike, and one statement cannot both update a row and delete it. A trigger covers
-- every one of them, and any added later, inside the failing statement itself: the failure
-- and the move commit or roll back together, and the statement's RETURNING still hands hooks
-- and follow-ups the failed row. The queue's setting is read from awa.queue_settings, which
-- each worker writes at start for the queues it runs; so a rescue by a leader that does not
-- run the queue, or a callback failed from an admin script, moves the job the same way.
--
-- Cost: the trigger fires only for rows becoming failed (its WHEN clause is checked without
-- calling the function). Other transitions (claims, completions) pay that check: a fraction
-- of a microsecond per row, no statement and no round trip. A failure in a queue without
-- the DLQ pays one primary-key lookup in awa.queue_settings.

-- Per-queue settings a worker stores when it starts (the last worker to start wins).
CREATE TABLE awa.queue_settings (
    queue text PRIMARY KEY,
    dlq_enabled boolean NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Every column of awa.jobs (the row as it failed), then why and when it was moved. A
-- migration that adds a column to awa.jobs adds it here and to the trigger function and
-- dlq_retry (a test compares the two tables).
CREATE TABLE awa.dlq_entries (
    id bigint PRIMARY KEY,
    kind text NOT NULL,
    queue text NOT NULL,
    args jsonb NOT NULL,
    state awa.job_state NOT NULL,
    priority smallint NOT NULL,
    attempt smallint NOT NULL,
    max_attempts smallint NOT NULL,
    run_lease bigint NOT NULL,
    run_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL,
    attempted_at timestamptz,
    finalized_at timestamptz,
    heartbeat_at timestamptz,
    deadline_at timestamptz,
    deadline_duration interval,
    errors jsonb NOT NULL,
    metadata jsonb NOT NULL,
    tags text[] NOT NULL,
    unique_key bytea,
    unique_states smallint,
    ordering_key bytea,
    callback_id uuid,
    callback_timeout_at timestamptz,
    callback_filter text,
    callback_on_complete text,
    callback_on_fail text,
    callback_transform text,
    callback_in_handler boolean NOT NULL,
    progress jsonb,
    output jsonb,
    concurrency_key text,
    -- max_attempts_exhausted, terminal_error, callback_failed, a rescue reason
    -- (stale_heartbeat, deadline_exceeded, expired_callback), or an operator's text.
    reason text NOT NULL,
    dlq_at timestamptz NOT NULL DEFAULT now(),
    -- The run_lease of the attempt that failed.
    original_run_lease bigint NOT NULL,
    CONSTRAINT dlq_entries_reason_length CHECK (length(reason) BETWEEN 1 AND 200)
);

-- Newest first (scanned backwards) with the (dlq_at, id) cursor, and retention oldest first.
CREATE INDEX dlq_entries_dlq_at_idx ON awa.dlq_entries (dlq_at, id);
-- The same order within one kind or one queue; tags through the array containment operator.
CREATE INDEX dlq_entries_kind_idx ON awa.dlq_entries (kind, dlq_at, id);
CREATE INDEX dlq_entries_queue_idx ON awa.dlq_entries (queue, dlq_at, id);
CREATE INDEX dlq_entries_tags_idx ON awa.dlq_entries USING gin (tags);

-- A failed job's row as a DLQ entry: every column of awa.jobs (the entry table has each of
-- them, a test holds them equal), plus why and when. Built from the row as JSON, so that a
-- column added to both tables needs no change here.
CREATE FUNCTION awa.dlq_snapshot(p_job jsonb, p_reason text) RETURNS awa.dlq_entries
LANGUAGE sql STABLE AS $$
    SELECT * FROM jsonb_populate_record(
        NULL::awa.dlq_entries,
        p_job || jsonb_build_object(
            'reason', p_reason, 'dlq_at', now(), 'original_run_lease', p_job -> 'run_lease'))
$$;

-- The move: copy the failed row, then delete it from awa.jobs. The reason comes from the
-- error entry the failing statement just appended. An entry left with the same id (ids
-- given explicitly, or a sequence reset) is replaced: the failure path must never error.
CREATE FUNCTION awa.move_failed_job_to_dlq() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_last jsonb := NEW.errors -> -1;
    v_reason text;
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM awa.queue_settings AS s WHERE s.queue = NEW.queue AND s.dlq_enabled
    ) THEN
        RETURN NULL;
    END IF;
    v_reason := CASE
        WHEN v_last ? 'rescued'
            THEN left(COALESCE(NULLIF(v_last ->> 'rescued', ''), 'rescued'), 200)
        -- Only a callback answered with fail clears the callback a running or parked job held.
        WHEN OLD.callback_id IS NOT NULL AND NEW.callback_id IS NULL THEN 'callback_failed'
        WHEN v_last -> 'terminal' = 'true'::jsonb THEN 'terminal_error'
        ELSE 'max_attempts_exhausted'
    END;
    DELETE FROM awa.dlq_entries AS d WHERE d.id = NEW.id;
    -- Every column of the row, whatever later migrations add to both tables.
    INSERT INTO awa.dlq_entries
    SELECT * FROM awa.dlq_snapshot(to_jsonb(NEW), v_reason);
    DELETE FROM awa.jobs AS j WHERE j.id = NEW.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_dlq_move
    AFTER UPDATE OF state ON awa.jobs
    FOR EACH ROW
    WHEN (NEW.state = 'failed' AND OLD.state <> 'failed')
    EXECUTE FUNCTION awa.move_failed_job_to_dlq();
