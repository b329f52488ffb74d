-- Storage that stays fast while a long transaction pins the MVCC horizon.
--
-- Until this migration every job was one row of one table, rewritten by its claim and by its
-- completion. Each job left dead row versions and dead index entries that vacuum may remove
-- only once no transaction can still see them; while a report, a backup or an idle session
-- holds an old snapshot, they pile up and every claim walked them again (docs/architecture.md
-- has the measurements). The job row now lives in one of three tables, by state:
--
--   awa.active_jobs   available and running jobs: the claim's table. Partitioned in two slots
--                     (LIST on slot): the leader seals the current one, then moves the few
--                     live rows of the other into it and truncates that one, which frees
--                     its dead versions whatever snapshot is held (TRUNCATE needs no
--                     vacuum). Two slots, not more: every claim and completion opens each
--                     slot and its indexes, which costs more than the drain can spare.
--   awa.done_jobs     completed jobs: append-only, in a ring of slots that retention
--                     truncates a whole slot at a time.
--   awa.held_jobs     every other state (scheduled, retryable, blocked, waiting_external,
--                     failed, cancelled): jobs off the hot path, in a plain table.
--
-- A transition between homes moves the row (delete, then insert in the same statement).
-- awa.jobs becomes the read model: a view over the three with the columns the table had.
-- Writes through the view (operators' scripts, the admin surface's rare statements) are
-- routed by INSTEAD OF triggers; the hot paths write the tables directly.
--
-- Unique keys span the three tables, so they move to awa.unique_keys, kept by triggers on
-- the tables: a row holds its key while its state is in its mask, as before.
--
-- The enum value 'blocked' (migration 11) may be added in this same transaction, so nothing
-- here names it as an enum literal: comparisons go through state::text.

ALTER TABLE awa.jobs RENAME TO jobs_before_storage;
-- Its name passes to the unique key table below.
DROP INDEX awa.jobs_unique_key_idx;

-- Ids outlive any one table: one sequence for every home, continuing the old identity.
CREATE SEQUENCE awa.job_id_seq AS bigint;
DO $$
DECLARE
    v_last bigint;
    v_called boolean;
BEGIN
    EXECUTE format('SELECT last_value, is_called FROM %s',
                   pg_get_serial_sequence('awa.jobs_before_storage', 'id'))
        INTO v_last, v_called;
    v_last := greatest(v_last, (SELECT max(id) FROM awa.jobs_before_storage));
    PERFORM setval('awa.job_id_seq', v_last,
                   v_called OR EXISTS (SELECT 1 FROM awa.jobs_before_storage));
END
$$;

-- Which home a state lives in.
CREATE FUNCTION awa.job_home(s awa.job_state) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE s::text
        WHEN 'available' THEN 'active'
        WHEN 'running' THEN 'active'
        WHEN 'completed' THEN 'done'
        ELSE 'held'
    END
$$;

-- A job's place in its claim lane, (run_at, id), travels as microseconds since the epoch:
-- exact, and cheap to compare and to send in a notification.
CREATE FUNCTION awa.position_us(t timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (extract(epoch FROM t) * 1000000)::bigint
$$;

-- What awa_ready carries for a job that became available: "priority position_us id queue"
-- (the queue last: it may hold spaces; see worker/lanes.py).
CREATE FUNCTION awa.ready_payload(p_priority smallint, p_run_at timestamptz, p_id bigint,
                                  p_queue text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT format('%s %s %s %s', p_priority, awa.position_us(p_run_at), p_id, p_queue)
$$;

CREATE FUNCTION awa.position_at(us bigint) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN us IS NULL THEN '-infinity'::timestamptz
                ELSE to_timestamp(0) + us * interval '1 microsecond' END
$$;

-- The current slot of each ring is a sequence's value: reading it costs no row version, so
-- an insert's default stays as cheap under a pinned horizon as without one. The leader sets
-- it (setval) when it rotates the ring.
CREATE SEQUENCE awa.active_slot MINVALUE 0 MAXVALUE 1 START 0 NO CYCLE;
CREATE SEQUENCE awa.done_slot MINVALUE 0 MAXVALUE 7 START 0 NO CYCLE;

-- Every role that inserts a job reads them (the slot is the insert's default).
GRANT SELECT ON SEQUENCE awa.active_slot, awa.done_slot TO PUBLIC;

CREATE FUNCTION awa.active_slot() RETURNS smallint
LANGUAGE sql STABLE PARALLEL SAFE AS $$ SELECT last_value::smallint FROM awa.active_slot $$;

CREATE FUNCTION awa.done_slot() RETURNS smallint
LANGUAGE sql STABLE PARALLEL SAFE AS $$ SELECT last_value::smallint FROM awa.done_slot $$;

-- When each slot last became current and when it stopped being current (the leader's
-- bookkeeping for rotation and retention; one row per slot, written once per rotation).
CREATE TABLE awa.storage_slots (
    ring text NOT NULL CHECK (ring IN ('active', 'done')),
    slot smallint NOT NULL,
    opened_at timestamptz NOT NULL DEFAULT now(),
    sealed_at timestamptz,
    PRIMARY KEY (ring, slot)
);
-- Slot 0 starts as current; the others are empty, free for the first rotations.
INSERT INTO awa.storage_slots (ring, slot, opened_at, sealed_at)
SELECT 'active', s, now(), CASE WHEN s = 0 THEN NULL ELSE '-infinity'::timestamptz END
FROM generate_series(0, 1) AS s
UNION ALL
SELECT 'done', s, now(), CASE WHEN s = 0 THEN NULL ELSE '-infinity'::timestamptz END
FROM generate_series(0, 7) AS s;

-- The three homes share the job row's columns (in the view's order); the rings add their
-- slot. A migration that adds a column to the job row adds it to the three tables, the view
-- and awa.dlq_entries (a test holds them equal).
CREATE TABLE awa.held_jobs (
    LIKE awa.jobs_before_storage INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE
);
ALTER TABLE awa.held_jobs ALTER COLUMN id SET DEFAULT nextval('awa.job_id_seq');
ALTER TABLE awa.held_jobs ADD CONSTRAINT held_jobs_pkey PRIMARY KEY (id);
ALTER TABLE awa.held_jobs SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02
);

CREATE TABLE awa.active_jobs (
    LIKE awa.jobs_before_storage INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE,
    slot smallint NOT NULL DEFAULT awa.active_slot()
) PARTITION BY LIST (slot);
ALTER TABLE awa.active_jobs ALTER COLUMN id SET DEFAULT nextval('awa.job_id_seq');
-- fillfactor leaves room for heartbeats to update in place (HOT); vacuum runs early when no
-- snapshot stops it, between the truncations that rotation makes anyway.
CREATE TABLE awa.active_jobs_0 PARTITION OF awa.active_jobs FOR VALUES IN (0)
    WITH (fillfactor = 90, autovacuum_vacuum_scale_factor = 0.02,
          autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02);
CREATE TABLE awa.active_jobs_1 PARTITION OF awa.active_jobs FOR VALUES IN (1)
    WITH (fillfactor = 90, autovacuum_vacuum_scale_factor = 0.02,
          autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02);

CREATE TABLE awa.done_jobs (
    LIKE awa.jobs_before_storage INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE,
    slot smallint NOT NULL DEFAULT awa.done_slot()
) PARTITION BY LIST (slot);
ALTER TABLE awa.done_jobs ALTER COLUMN id SET DEFAULT nextval('awa.job_id_seq');
DO $$
BEGIN
    FOR s IN 0..7 LOOP
        EXECUTE format(
            'CREATE TABLE awa.done_jobs_%s PARTITION OF awa.done_jobs FOR VALUES IN (%s)'
            ' WITH (autovacuum_vacuum_insert_scale_factor = 0.05,'
            ' autovacuum_analyze_scale_factor = 0.02)', s, s);
    END LOOP;
END
$$;

-- Move the jobs to their homes.
INSERT INTO awa.active_jobs SELECT j.*, 0 FROM awa.jobs_before_storage AS j
WHERE j.state::text IN ('available', 'running');
INSERT INTO awa.done_jobs SELECT j.*, 0 FROM awa.jobs_before_storage AS j
WHERE j.state::text = 'completed';
INSERT INTO awa.held_jobs SELECT j.* FROM awa.jobs_before_storage AS j
WHERE j.state::text NOT IN ('available', 'running', 'completed');

-- Unique keys across the homes. The primary key keeps the old index's name, which the
-- producer path recognizes in a violation.
CREATE TABLE awa.unique_keys (
    unique_key bytea NOT NULL,
    job_id bigint NOT NULL,
    CONSTRAINT jobs_unique_key_idx PRIMARY KEY (unique_key)
);
INSERT INTO awa.unique_keys (unique_key, job_id)
SELECT j.unique_key, j.id FROM awa.jobs_before_storage AS j
WHERE j.unique_key IS NOT NULL AND awa.unique_key_held(j.unique_states, j.state);

DROP TABLE awa.jobs_before_storage;

-- Each home holds only its states: a statement on the view that names a state reads only
-- the home that can hold it (the planner excludes the others by these constraints).
ALTER TABLE awa.active_jobs ADD CONSTRAINT active_jobs_home
    CHECK (state IN ('available', 'running'));
ALTER TABLE awa.done_jobs ADD CONSTRAINT done_jobs_home CHECK (state = 'completed');
ALTER TABLE awa.held_jobs ADD CONSTRAINT held_jobs_home
    CHECK (state NOT IN ('available', 'running', 'completed'));

-- Indexes. The claim's path: due jobs of one queue, by priority, then run_at, then id.
CREATE INDEX active_jobs_available_idx ON awa.active_jobs (queue, priority, run_at, id)
    WHERE state = 'available';
-- Lookups by id (a ring cannot hold a unique index without its slot; ids are unique by
-- construction, a job living in exactly one home).
CREATE INDEX active_jobs_id_idx ON awa.active_jobs (id);
-- Running jobs per queue and key: caps, per-key limits and rescue (and the few running
-- jobs that hold a callback: the slots have no index of their own for it, nor for unique
-- keys, which awa.unique_keys answers: every index is one more to open in each slot).
CREATE INDEX active_jobs_running_idx ON awa.active_jobs (queue, concurrency_key)
    WHERE state = 'running';
CREATE INDEX active_jobs_trigger_idx
    ON awa.active_jobs (((metadata -> 'awa:trigger' ->> 'id')::bigint))
    WHERE metadata ? 'awa:trigger';
CREATE INDEX active_jobs_workflow_idx ON awa.active_jobs (workflow_id, id)
    WHERE workflow_id IS NOT NULL;

CREATE INDEX done_jobs_id_idx ON awa.done_jobs (id);
CREATE INDEX done_jobs_unique_key_idx ON awa.done_jobs (unique_key)
    WHERE unique_key IS NOT NULL;
CREATE INDEX done_jobs_finalized_idx ON awa.done_jobs (finalized_at);
CREATE INDEX done_jobs_trigger_idx
    ON awa.done_jobs (((metadata -> 'awa:trigger' ->> 'id')::bigint))
    WHERE metadata ? 'awa:trigger';
CREATE INDEX done_jobs_workflow_idx ON awa.done_jobs (workflow_id, id)
    WHERE workflow_id IS NOT NULL;

CREATE INDEX held_jobs_unique_key_idx ON awa.held_jobs (unique_key)
    WHERE unique_key IS NOT NULL;
-- Promotion of due scheduled and retryable jobs.
CREATE INDEX held_jobs_pending_idx ON awa.held_jobs (run_at, id)
    WHERE state IN ('scheduled', 'retryable');
-- Expired-callback rescue.
CREATE INDEX held_jobs_waiting_idx ON awa.held_jobs (callback_timeout_at)
    WHERE state = 'waiting_external';
CREATE UNIQUE INDEX held_jobs_callback_idx ON awa.held_jobs (callback_id)
    WHERE callback_id IS NOT NULL;
-- Failed and cancelled jobs: lists newest first, and retention oldest first.
CREATE INDEX held_jobs_problem_idx ON awa.held_jobs (id) WHERE state IN ('failed', 'cancelled');
CREATE INDEX held_jobs_finalized_idx ON awa.held_jobs (finalized_at)
    WHERE state IN ('failed', 'cancelled');
CREATE INDEX held_jobs_trigger_idx
    ON awa.held_jobs (((metadata -> 'awa:trigger' ->> 'id')::bigint))
    WHERE metadata ? 'awa:trigger';
CREATE INDEX held_jobs_workflow_idx ON awa.held_jobs (workflow_id, id)
    WHERE workflow_id IS NOT NULL;

-- The read model: every job in every state, with the columns awa.jobs always had.
CREATE VIEW awa.jobs AS
SELECT id, kind, queue, args, state, priority, attempt, max_attempts, run_lease, run_at,
    created_at, attempted_at, finalized_at, heartbeat_at, deadline_at, deadline_duration,
    errors, metadata, tags, unique_key, unique_states, ordering_key, callback_id,
    callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail,
    callback_transform, callback_in_handler, progress, output, concurrency_key, workflow_id,
    has_dependents, watched
FROM awa.active_jobs
UNION ALL
SELECT id, kind, queue, args, state, priority, attempt, max_attempts, run_lease, run_at,
    created_at, attempted_at, finalized_at, heartbeat_at, deadline_at, deadline_duration,
    errors, metadata, tags, unique_key, unique_states, ordering_key, callback_id,
    callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail,
    callback_transform, callback_in_handler, progress, output, concurrency_key, workflow_id,
    has_dependents, watched
FROM awa.held_jobs
UNION ALL
SELECT id, kind, queue, args, state, priority, attempt, max_attempts, run_lease, run_at,
    created_at, attempted_at, finalized_at, heartbeat_at, deadline_at, deadline_duration,
    errors, metadata, tags, unique_key, unique_states, ordering_key, callback_id,
    callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail,
    callback_transform, callback_in_handler, progress, output, concurrency_key, workflow_id,
    has_dependents, watched
FROM awa.done_jobs;

COMMENT ON VIEW awa.jobs IS
    'Every job in every state (the read model over awa.active_jobs, awa.held_jobs and '
    'awa.done_jobs). Writes are routed to the right table by INSTEAD OF triggers.';

ALTER VIEW awa.jobs ALTER COLUMN id SET DEFAULT nextval('awa.job_id_seq');
ALTER VIEW awa.jobs ALTER COLUMN queue SET DEFAULT 'default';
ALTER VIEW awa.jobs ALTER COLUMN args SET DEFAULT '{}';
ALTER VIEW awa.jobs ALTER COLUMN state SET DEFAULT 'available';
ALTER VIEW awa.jobs ALTER COLUMN priority SET DEFAULT 2;
ALTER VIEW awa.jobs ALTER COLUMN attempt SET DEFAULT 0;
ALTER VIEW awa.jobs ALTER COLUMN max_attempts SET DEFAULT 25;
ALTER VIEW awa.jobs ALTER COLUMN run_lease SET DEFAULT 0;
ALTER VIEW awa.jobs ALTER COLUMN run_at SET DEFAULT now();
ALTER VIEW awa.jobs ALTER COLUMN created_at SET DEFAULT now();
ALTER VIEW awa.jobs ALTER COLUMN errors SET DEFAULT '[]';
ALTER VIEW awa.jobs ALTER COLUMN metadata SET DEFAULT '{}';
ALTER VIEW awa.jobs ALTER COLUMN tags SET DEFAULT '{}';
ALTER VIEW awa.jobs ALTER COLUMN callback_in_handler SET DEFAULT false;
ALTER VIEW awa.jobs ALTER COLUMN has_dependents SET DEFAULT false;
ALTER VIEW awa.jobs ALTER COLUMN watched SET DEFAULT false;

-- Writes through the view. A row goes to the home of its state; an update that changes the
-- home moves it. Each write re-checks the row's state, run_lease and callback as the view
-- showed them, so a row that changed meanwhile (claimed, finished, resolved) is left alone
-- and counts as skipped.

CREATE FUNCTION awa.store_job(j awa.jobs) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    CASE awa.job_home(j.state)
    WHEN 'active' THEN INSERT INTO awa.active_jobs SELECT (j).*, awa.active_slot();
    WHEN 'done' THEN INSERT INTO awa.done_jobs SELECT (j).*, awa.done_slot();
    ELSE INSERT INTO awa.held_jobs SELECT (j).*;
    END CASE;
END
$$;

CREATE FUNCTION awa.drop_job(
    p_id bigint, p_state awa.job_state, p_lease bigint, p_callback uuid
) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    CASE awa.job_home(p_state)
    WHEN 'active' THEN
        DELETE FROM awa.active_jobs AS t
        WHERE t.id = p_id AND t.state = p_state AND t.run_lease = p_lease
          AND t.callback_id IS NOT DISTINCT FROM p_callback;
    WHEN 'done' THEN
        DELETE FROM awa.done_jobs AS t
        WHERE t.id = p_id AND t.state = p_state AND t.run_lease = p_lease
          AND t.callback_id IS NOT DISTINCT FROM p_callback;
    ELSE
        DELETE FROM awa.held_jobs AS t
        WHERE t.id = p_id AND t.state = p_state AND t.run_lease = p_lease
          AND t.callback_id IS NOT DISTINCT FROM p_callback;
    END CASE;
    RETURN FOUND;
END
$$;

CREATE FUNCTION awa.jobs_view_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM awa.store_job(NEW);
    RETURN NEW;
END
$$;

-- An update through the view. A change of home is a move (drop, then store). An update in
-- place sets only the columns the statement changed, each to its new value, and leaves the
-- others as the row has them now: a heartbeat, a progress flush or a flag set by another
-- transaction since this statement's snapshot is kept, as a plain table's UPDATE would keep
-- it. The SET list is generated from the columns of the job row (awa.held_jobs has them
-- all, in order), so a column added later is covered by recreating this function.
DO $$
DECLARE
    v_set text;
    v_in_place text := '';
    home text;
BEGIN
    SELECT string_agg(format('%1$I = CASE WHEN NEW.%1$I IS DISTINCT FROM OLD.%1$I'
                             ' THEN NEW.%1$I ELSE t.%1$I END', a.attname),
                      ', ' ORDER BY a.attnum)
    INTO v_set
    FROM pg_attribute AS a
    WHERE a.attrelid = 'awa.held_jobs'::regclass AND a.attnum > 0 AND NOT a.attisdropped;
    FOREACH home IN ARRAY ARRAY['active', 'done', 'held'] LOOP
        v_in_place := v_in_place || format(
            ' WHEN %1$L THEN UPDATE awa.%1$s_jobs AS t SET %2$s'
            ' WHERE t.id = OLD.id AND t.state = OLD.state AND t.run_lease = OLD.run_lease'
            ' AND t.callback_id IS NOT DISTINCT FROM OLD.callback_id;', home, v_set);
    END LOOP;
    EXECUTE format($f$
CREATE FUNCTION awa.jobs_view_update() RETURNS trigger
LANGUAGE plpgsql AS $body$
DECLARE
    v_home text := awa.job_home(OLD.state);
BEGIN
    IF v_home <> awa.job_home(NEW.state) THEN
        -- Two statements: the delete's row triggers run before the insert, so they learn
        -- from awa.moving_job that the job moves rather than goes.
        PERFORM set_config('awa.moving_job', OLD.id::text, true);
        IF NOT awa.drop_job(OLD.id, OLD.state, OLD.run_lease, OLD.callback_id) THEN
            PERFORM set_config('awa.moving_job', '', true);
            RETURN NULL;
        END IF;
        PERFORM set_config('awa.moving_job', '', true);
        PERFORM awa.store_job(NEW);
    ELSE
        CASE v_home %s END CASE;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        -- An available job whose place in its lane changed: claimers look again from the
        -- start of the queue's lanes (a moved job announces its own place). One that stayed
        -- in place was locked by this update, so a claim running meanwhile skipped it, and
        -- its lane is announced again.
        IF NEW.state::text = 'available' THEN
            IF OLD.state::text <> 'available'
                    OR (NEW.priority, NEW.run_at, NEW.queue) IS DISTINCT FROM
                       (OLD.priority, OLD.run_at, OLD.queue) THEN
                PERFORM pg_notify('awa_jobs', NEW.queue);
            ELSE
                PERFORM pg_notify('awa_ready', awa.ready_payload(NEW.priority, NEW.run_at,
                                                                 NEW.id, NEW.queue));
            END IF;
        END IF;
    END IF;
    RETURN NEW;
END
$body$
$f$, v_in_place);
END
$$;

CREATE FUNCTION awa.jobs_view_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT awa.drop_job(OLD.id, OLD.state, OLD.run_lease, OLD.callback_id) THEN
        RETURN NULL;
    END IF;
    RETURN OLD;
END
$$;

CREATE TRIGGER jobs_view_insert INSTEAD OF INSERT ON awa.jobs
    FOR EACH ROW EXECUTE FUNCTION awa.jobs_view_insert();
CREATE TRIGGER jobs_view_update INSTEAD OF UPDATE ON awa.jobs
    FOR EACH ROW EXECUTE FUNCTION awa.jobs_view_update();
CREATE TRIGGER jobs_view_delete INSTEAD OF DELETE ON awa.jobs
    FOR EACH ROW EXECUTE FUNCTION awa.jobs_view_delete();

-- Unique keys. A row holds its key while its state is in its mask; the key table says which
-- job holds each key. Triggers on the three homes keep it, after each statement's rows are
-- written: a move deletes the row from one home and inserts it into another, and by the time
-- the triggers run both halves are done, so a release checks that the job is really gone.

-- Take the key for the job; false when another job holds it. A stale entry (its job gone or
-- no longer holding the key) is taken over.
CREATE FUNCTION awa.take_unique_key(p_key bytea, p_job bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_holder bigint;
BEGIN
    INSERT INTO awa.unique_keys AS k (unique_key, job_id) VALUES (p_key, p_job)
    ON CONFLICT ON CONSTRAINT jobs_unique_key_idx DO NOTHING;
    IF FOUND THEN
        RETURN true;
    END IF;
    SELECT k.job_id INTO v_holder FROM awa.unique_keys AS k WHERE k.unique_key = p_key
    FOR UPDATE;
    IF v_holder = p_job THEN
        RETURN true;
    END IF;
    IF v_holder IS NOT NULL AND EXISTS (
        SELECT 1 FROM awa.jobs AS j
        WHERE j.id = v_holder AND j.unique_key = p_key
          AND awa.unique_key_held(j.unique_states, j.state)
    ) THEN
        RETURN false;
    END IF;
    UPDATE awa.unique_keys AS k SET job_id = p_job WHERE k.unique_key = p_key;
    RETURN true;
END
$$;

CREATE FUNCTION awa.hold_unique_key() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.unique_key IS NOT NULL
            AND OLD.unique_key IS DISTINCT FROM NEW.unique_key THEN
        DELETE FROM awa.unique_keys AS k
        WHERE k.unique_key = OLD.unique_key AND k.job_id = OLD.id;
    END IF;
    IF NEW.unique_key IS NULL THEN
        RETURN NULL;
    END IF;
    IF NOT awa.unique_key_held(NEW.unique_states, NEW.state) THEN
        DELETE FROM awa.unique_keys AS k
        WHERE k.unique_key = NEW.unique_key AND k.job_id = NEW.id;
    ELSIF NOT EXISTS (SELECT 1 FROM awa.unique_keys AS k
                      WHERE k.unique_key = NEW.unique_key AND k.job_id = NEW.id)
          AND NOT awa.take_unique_key(NEW.unique_key, NEW.id) THEN
        RAISE EXCEPTION 'duplicate key value violates unique constraint "jobs_unique_key_idx"'
            USING ERRCODE = 'unique_violation', CONSTRAINT = 'jobs_unique_key_idx',
                  SCHEMA = 'awa', TABLE = 'jobs',
                  DETAIL = format('Key (unique_key)=(\x%s) already exists.',
                                  encode(NEW.unique_key, 'hex'));
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION awa.release_unique_key() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('awa.moving_job', true) = OLD.id::text THEN
        RETURN NULL;  -- moved by the view's trigger: the insert that follows keeps the key
    END IF;
    DELETE FROM awa.unique_keys AS k
    WHERE k.unique_key = OLD.unique_key AND k.job_id = OLD.id
      AND NOT EXISTS (SELECT 1 FROM awa.jobs AS j WHERE j.id = OLD.id);
    RETURN NULL;
END
$$;

DO $$
DECLARE
    home text;
BEGIN
    FOREACH home IN ARRAY ARRAY['active_jobs', 'held_jobs', 'done_jobs'] LOOP
        EXECUTE format(
            'CREATE TRIGGER %1$s_unique_insert AFTER INSERT ON awa.%1$s FOR EACH ROW'
            ' WHEN (NEW.unique_key IS NOT NULL) EXECUTE FUNCTION awa.hold_unique_key()', home);
        EXECUTE format(
            'CREATE TRIGGER %1$s_unique_update'
            ' AFTER UPDATE OF state, unique_key, unique_states ON awa.%1$s FOR EACH ROW'
            ' WHEN (NEW.unique_key IS NOT NULL OR OLD.unique_key IS NOT NULL)'
            ' EXECUTE FUNCTION awa.hold_unique_key()', home);
        EXECUTE format(
            'CREATE TRIGGER %1$s_unique_delete AFTER DELETE ON awa.%1$s FOR EACH ROW'
            ' WHEN (OLD.unique_key IS NOT NULL) EXECUTE FUNCTION awa.release_unique_key()',
            home);
    END LOOP;
END
$$;

-- Wake workers when jobs become available, saying where in its lane the earliest one sits:
-- awa_ready carries "priority position_us id queue" for each (queue, priority) of the
-- statement's available rows. A claimer remembers how far it has claimed in each lane and
-- starts its next claim there instead of at the head of the lane, whose dead entries a
-- pinned horizon keeps; a job committed behind that point (a transaction that committed
-- late, a promoted job with an old run_at) moves the point back. Within one transaction a
-- lane is announced once unless a later row sits before the first (an explicit run_at in
-- the past): rows inserted later in the transaction sit after it. Rows moved between slots
-- by rotation are not announced (their place does not change).
CREATE FUNCTION awa.notify_ready_jobs() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_seen text;
    v_lane text;
    v_changed boolean := false;
    r record;
BEGIN
    IF current_setting('awa.storage_move', true) = 'on' THEN
        RETURN NULL;
    END IF;
    v_seen := coalesce(current_setting('awa.ready_lanes', true), '');
    FOR r IN
        SELECT DISTINCT ON (n.queue, n.priority) n.queue, n.priority, n.run_at, n.id
        FROM inserted_jobs AS n
        WHERE n.state = 'available'
        ORDER BY n.queue, n.priority, n.run_at, n.id
    LOOP
        v_lane := ',' || md5(r.queue) || r.priority::text || ',';
        CONTINUE WHEN r.run_at >= now() AND strpos(v_seen, v_lane) > 0;
        PERFORM pg_notify('awa_ready', awa.ready_payload(r.priority, r.run_at, r.id, r.queue));
        IF strpos(v_seen, v_lane) = 0 THEN
            v_seen := v_seen || v_lane;
            v_changed := true;
        END IF;
    END LOOP;
    IF v_changed THEN
        PERFORM set_config('awa.ready_lanes', v_seen, true);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER active_jobs_notify_insert
    AFTER INSERT ON awa.active_jobs
    REFERENCING NEW TABLE AS inserted_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION awa.notify_ready_jobs();

-- The dead-letter queue's move (migration 7), for the homes a job fails in: a running job
-- that fails moves into held_jobs as failed (an insert), a parked one fails in place (an
-- update). A callback answered with fail names its jobs in awa.callback_failed (a
-- transaction-local setting), so that the move records why.
CREATE OR REPLACE FUNCTION awa.move_failed_job_to_dlq() RETURNS trigger
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
        WHEN NEW.id::text = ANY(string_to_array(current_setting('awa.callback_failed', true),
                                                ','))
            THEN 'callback_failed'
        WHEN TG_OP = 'UPDATE' AND OLD.callback_id IS NOT NULL AND NEW.callback_id IS NULL
            THEN 'callback_failed'
        WHEN v_last -> 'terminal' = 'true'::jsonb THEN 'terminal_error'
        ELSE 'max_attempts_exhausted'
    END;
    DELETE FROM awa.dlq_entries AS d WHERE d.id = NEW.id;
    INSERT INTO awa.dlq_entries
    SELECT * FROM awa.dlq_snapshot(to_jsonb(NEW), v_reason);
    DELETE FROM awa.held_jobs AS j WHERE j.id = NEW.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER held_jobs_dlq_insert
    AFTER INSERT ON awa.held_jobs
    FOR EACH ROW
    WHEN (NEW.state = 'failed')
    EXECUTE FUNCTION awa.move_failed_job_to_dlq();

CREATE TRIGGER held_jobs_dlq_update
    AFTER UPDATE OF state ON awa.held_jobs
    FOR EACH ROW
    WHEN (NEW.state = 'failed' AND OLD.state <> 'failed')
    EXECUTE FUNCTION awa.move_failed_job_to_dlq();

-- Workflows (migration 11), for the homes: a job finishes by arriving in done_jobs, or in
-- held_jobs as failed or cancelled, or by turning failed or cancelled there. A deleted row
-- counts as a deleted parent only when the job is gone from every home (not moved).
CREATE OR REPLACE FUNCTION awa.note_deleted_parent() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    children text;
BEGIN
    IF current_setting('awa.moving_job', true) = OLD.id::text
            OR EXISTS (SELECT 1 FROM awa.jobs AS j WHERE j.id = OLD.id) THEN
        RETURN NULL;  -- moved to another home, not deleted
    END IF;
    WITH resolved AS (
        UPDATE awa.job_dependencies AS d
        SET resolved = CASE WHEN OLD.state::text IN ('completed', 'failed', 'cancelled')
                            THEN OLD.state::text ELSE 'cancelled' END
        WHERE d.parent_id = OLD.id AND d.resolved IS NULL
          AND (OLD.state::text = 'completed' OR d.policy <> 'wait')
        RETURNING d.child_id
    )
    SELECT string_agg(child_id::text, ',') INTO children FROM resolved;
    IF children IS NOT NULL THEN
        PERFORM set_config('awa.unsettled_children',
                           coalesce(current_setting('awa.unsettled_children', true), '')
                               || children || ',',
                           true);
    END IF;
    IF OLD.watched THEN
        PERFORM pg_notify('awa_finished', OLD.id::text);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER done_jobs_note_finished
    AFTER INSERT ON awa.done_jobs
    FOR EACH ROW
    WHEN (NEW.has_dependents OR NEW.watched)
    EXECUTE FUNCTION awa.note_finished_job();

CREATE TRIGGER held_jobs_note_finished_insert
    AFTER INSERT ON awa.held_jobs
    FOR EACH ROW
    WHEN ((NEW.has_dependents OR NEW.watched)
          AND NEW.state::text IN ('failed', 'cancelled'))
    EXECUTE FUNCTION awa.note_finished_job();

CREATE TRIGGER held_jobs_note_finished_update
    AFTER UPDATE OF state ON awa.held_jobs
    FOR EACH ROW
    WHEN ((NEW.has_dependents OR NEW.watched)
          AND NEW.state::text IN ('failed', 'cancelled')
          AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION awa.note_finished_job();

DO $$
DECLARE
    home text;
BEGIN
    FOREACH home IN ARRAY ARRAY['active_jobs', 'held_jobs', 'done_jobs'] LOOP
        EXECUTE format(
            'CREATE TRIGGER %1$s_note_deleted_parent AFTER DELETE ON awa.%1$s FOR EACH ROW'
            ' WHEN (OLD.has_dependents OR OLD.watched)'
            ' EXECUTE FUNCTION awa.note_deleted_parent()', home);
    END LOOP;
END
$$;

-- The settlement runs after each statement that can finish a job or delete one: a job
-- finishes by arriving in done_jobs or held_jobs (a move from active_jobs ends with that
-- insert), or by an update or delete in held_jobs or done_jobs. Claims, heartbeats and
-- completions' deletes from active_jobs finish nothing by themselves and skip it; an
-- operator's delete of an available or running job goes through the view, whose own
-- statement trigger settles.
CREATE TRIGGER held_jobs_settle AFTER INSERT OR UPDATE OR DELETE ON awa.held_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION awa.settle_noted();
CREATE TRIGGER done_jobs_settle AFTER INSERT OR UPDATE OR DELETE ON awa.done_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION awa.settle_noted();

-- A statement on the view runs the homes' statements inside its row triggers, where the
-- settlement defers to the outermost statement: this one.
CREATE TRIGGER jobs_view_settle
    AFTER INSERT OR UPDATE OR DELETE ON awa.jobs
    FOR EACH STATEMENT EXECUTE FUNCTION awa.settle_noted();

-- A fan-in job's record of its batch members' outcomes, merged into its metadata.
CREATE FUNCTION awa.fan_in_metadata(p_child bigint, p_metadata jsonb) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_metadata ? 'awa:fan_in' THEN p_metadata || jsonb_build_object(
        'awa:batch', (
            SELECT jsonb_build_object(
                'counts', jsonb_object_agg(s.resolved, s.n),
                'ids', jsonb_object_agg(s.resolved, s.ids))
            FROM (SELECT d.resolved, count(*) AS n,
                         jsonb_agg(d.parent_id ORDER BY d.parent_id) AS ids
                  FROM awa.job_dependencies AS d
                  WHERE d.child_id = p_child
                  GROUP BY d.resolved) AS s))
    ELSE p_metadata END
$$;

-- Settle blocked children (migration 11's function, for the homes): blocked jobs live in
-- held_jobs; a released child due now moves to active_jobs (whose insert announces it), one
-- due later becomes scheduled in place.
CREATE OR REPLACE FUNCTION awa.settle_children(p_children bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
DECLARE
    locked bigint[];
BEGIN
    SELECT array_agg(l.id) INTO locked FROM (
        SELECT j.id FROM awa.held_jobs AS j
        WHERE j.id = ANY(p_children) AND j.state::text = 'blocked'
        ORDER BY j.id
        FOR UPDATE
    ) AS l;
    IF locked IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH blockers AS (
        SELECT DISTINCT ON (d.child_id) d.child_id, d.parent_id, d.resolved, p.kind
        FROM awa.job_dependencies AS d LEFT JOIN awa.jobs AS p ON p.id = d.parent_id
        WHERE d.child_id = ANY(locked) AND d.policy = 'cancel'
          AND d.resolved IN ('failed', 'cancelled')
        ORDER BY d.child_id, d.parent_id
    ), cancelled AS (
        UPDATE awa.held_jobs AS j
        SET state = 'cancelled', finalized_at = now(),
            errors = j.errors || jsonb_build_array(jsonb_build_object(
                'error', format('cancelled: dependency %s (%s) ended %s',
                                b.parent_id, coalesce(b.kind, 'deleted'), b.resolved),
                'attempt', j.attempt, 'at', now()))
        FROM blockers AS b
        WHERE j.id = b.child_id
        RETURNING j.id
    ), ready AS (
        SELECT c.id FROM unnest(locked) AS c(id)
        WHERE NOT EXISTS (SELECT 1 FROM blockers AS b WHERE b.child_id = c.id)
          AND NOT EXISTS (SELECT 1 FROM awa.job_dependencies AS d
                          WHERE d.child_id = c.id AND d.resolved IS NULL)
    ), later AS (
        UPDATE awa.held_jobs AS j
        SET state = 'scheduled', metadata = awa.fan_in_metadata(j.id, j.metadata)
        FROM ready AS r
        WHERE j.id = r.id AND j.run_at > now()
        RETURNING j.id
    ), due AS (
        DELETE FROM awa.held_jobs AS j
        USING ready AS r
        WHERE j.id = r.id AND j.run_at <= now()
        RETURNING j.*
    ), released AS (
        INSERT INTO awa.active_jobs (
            id, kind, queue, args, state, priority, attempt, max_attempts, run_lease, run_at,
            created_at, attempted_at, finalized_at, heartbeat_at, deadline_at,
            deadline_duration, errors, metadata, tags, unique_key, unique_states,
            ordering_key, callback_id, callback_timeout_at, callback_filter,
            callback_on_complete, callback_on_fail, callback_transform, callback_in_handler,
            progress, output, concurrency_key, workflow_id, has_dependents, watched)
        SELECT d.id, d.kind, d.queue, d.args, 'available', d.priority, d.attempt,
            d.max_attempts, d.run_lease, d.run_at, d.created_at, d.attempted_at,
            d.finalized_at, d.heartbeat_at, d.deadline_at, d.deadline_duration, d.errors,
            awa.fan_in_metadata(d.id, d.metadata), d.tags, d.unique_key, d.unique_states,
            d.ordering_key, d.callback_id, d.callback_timeout_at, d.callback_filter,
            d.callback_on_complete, d.callback_on_fail, d.callback_transform,
            d.callback_in_handler, d.progress, d.output, d.concurrency_key, d.workflow_id,
            d.has_dependents, d.watched
        FROM due AS d
        RETURNING id
    )
    SELECT c.id FROM cancelled AS c
    UNION ALL SELECT l.id FROM later AS l
    UNION ALL SELECT r.id FROM released AS r;
END
$$;

-- Resolve the edges of finished parents (migration 11's function, reading the view).
CREATE OR REPLACE FUNCTION awa.settle_dependents(p_parents bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
DECLARE
    changed bigint[];
BEGIN
    WITH resolved AS (
        UPDATE awa.job_dependencies AS d
        SET resolved = p.state::text
        FROM awa.jobs AS p
        WHERE p.id = ANY(p_parents) AND d.parent_id = p.id AND d.resolved IS NULL
          AND p.state::text IN ('completed', 'failed', 'cancelled')
          AND (p.state::text = 'completed' OR d.policy <> 'wait')
        RETURNING d.child_id
    )
    SELECT array_agg(DISTINCT child_id) INTO changed FROM resolved;
    IF changed IS NOT NULL THEN
        RETURN QUERY SELECT awa.settle_children(changed);
    END IF;
END
$$;

-- Flag jobs in whichever home they are (has_dependents, watched): the flags are not indexed,
-- so the update stays in place. Each statement takes a fresh snapshot: a job that moved
-- between homes meanwhile (claimed, completed, promoted) escapes the update of the home it
-- left, so the homes are updated again until every job carries its flags. A flagged job stays
-- locked until the caller commits, so it cannot finish unseen.
-- A claim running meanwhile skipped the available jobs this locked, and may have found their
-- lanes empty: each such lane is announced on awa_ready (sent at commit, once unlocked).
CREATE FUNCTION awa.flag_jobs(p_ids bigint[], p_dependents boolean, p_watched boolean)
RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    v_announced integer;
BEGIN
    LOOP
        WITH flagged AS (
            UPDATE awa.active_jobs AS j
            SET has_dependents = j.has_dependents OR p_dependents,
                watched = j.watched OR p_watched
            WHERE j.id = ANY(p_ids)
              AND ((p_dependents AND NOT j.has_dependents) OR (p_watched AND NOT j.watched))
            RETURNING j.queue, j.priority, j.run_at, j.id, j.state
        )
        SELECT count(pg_notify('awa_ready',
                               awa.ready_payload(f.priority, f.run_at, f.id, f.queue)))
        INTO v_announced
        FROM (
            SELECT DISTINCT ON (queue, priority) * FROM flagged
            WHERE state = 'available'
            ORDER BY queue, priority, run_at, id
        ) AS f;
        UPDATE awa.held_jobs AS j
        SET has_dependents = j.has_dependents OR p_dependents, watched = j.watched OR p_watched
        WHERE j.id = ANY(p_ids)
          AND ((p_dependents AND NOT j.has_dependents) OR (p_watched AND NOT j.watched));
        UPDATE awa.done_jobs AS j
        SET has_dependents = j.has_dependents OR p_dependents, watched = j.watched OR p_watched
        WHERE j.id = ANY(p_ids)
          AND ((p_dependents AND NOT j.has_dependents) OR (p_watched AND NOT j.watched));
        EXIT WHEN NOT EXISTS (
            SELECT 1 FROM awa.jobs AS j
            WHERE j.id = ANY(p_ids)
              AND ((p_dependents AND NOT j.has_dependents) OR (p_watched AND NOT j.watched))
        );
    END LOOP;
END
$$;

-- client.wait: flag these jobs watched (their final state is then announced on
-- awa_finished) and return every one of them as it is now.
CREATE FUNCTION awa.watch_jobs(p_ids bigint[]) RETURNS SETOF awa.jobs
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM awa.flag_jobs(p_ids, false, true);
    RETURN QUERY SELECT * FROM awa.jobs AS j WHERE j.id = ANY(p_ids);
END
$$;

-- Add edges (migration 11's function, for the homes): children inserted in this
-- transaction become blocked (moved to held_jobs when inserted available), then settle.
CREATE OR REPLACE FUNCTION awa.add_dependencies(
    p_children bigint[], p_parents bigint[], p_policies text[]
) RETURNS TABLE (child_id bigint, state text)
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
DECLARE
    missing bigint[];
    children bigint[];
BEGIN
    PERFORM awa.flag_jobs(p_parents, true, false);
    SELECT array_agg(DISTINCT wanted) INTO missing
    FROM unnest(p_parents) AS wanted
    WHERE NOT EXISTS (SELECT 1 FROM awa.jobs AS j WHERE j.id = wanted);
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'depends_on names jobs that do not exist: %', missing
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    INSERT INTO awa.job_dependencies AS d (child_id, parent_id, policy, resolved)
    SELECT e.child_id, e.parent_id, e.policy,
           CASE WHEN p.state::text = 'completed'
                  OR (p.state::text IN ('failed', 'cancelled') AND e.policy <> 'wait')
                THEN p.state::text END
    FROM unnest(p_children, p_parents, p_policies) AS e(child_id, parent_id, policy)
    JOIN awa.jobs AS p ON p.id = e.parent_id
    ON CONFLICT DO NOTHING;
    SELECT array_agg(DISTINCT c) INTO children FROM unnest(p_children) AS c;
    UPDATE awa.held_jobs AS j SET state = 'blocked'
    WHERE j.id = ANY(children) AND j.state::text <> 'blocked';
    WITH moving AS (
        DELETE FROM awa.active_jobs AS j
        WHERE j.id = ANY(children) AND j.state = 'available'
        RETURNING j.*
    )
    INSERT INTO awa.held_jobs (
        id, kind, queue, args, state, priority, attempt, max_attempts, run_lease, run_at,
        created_at, attempted_at, finalized_at, heartbeat_at, deadline_at, deadline_duration,
        errors, metadata, tags, unique_key, unique_states, ordering_key, callback_id,
        callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail,
        callback_transform, callback_in_handler, progress, output, concurrency_key,
        workflow_id, has_dependents, watched)
    SELECT m.id, m.kind, m.queue, m.args, 'blocked', m.priority, m.attempt, m.max_attempts,
        m.run_lease, m.run_at, m.created_at, m.attempted_at, m.finalized_at, m.heartbeat_at,
        m.deadline_at, m.deadline_duration, m.errors, m.metadata, m.tags, m.unique_key,
        m.unique_states, m.ordering_key, m.callback_id, m.callback_timeout_at,
        m.callback_filter, m.callback_on_complete, m.callback_on_fail, m.callback_transform,
        m.callback_in_handler, m.progress, m.output, m.concurrency_key, m.workflow_id,
        m.has_dependents, m.watched
    FROM moving AS m;
    PERFORM awa.settle_children(children);
    RETURN QUERY SELECT j.id, j.state::text FROM awa.jobs AS j WHERE j.id = ANY(children);
END
$$;

-- The jobs a claim under a per-key limit takes (migration 4's function, on active_jobs and
-- from the claimer's lane positions): in claim order, skipping the keys at their limit, and
-- no more per key than the key has room for, scanning a window a few times the room.
CREATE OR REPLACE FUNCTION awa.pick_keyed(
    p_queue text, p_room integer, p_key_concurrency integer, p_after_us bigint[],
    p_after_id bigint[], p_kinds text[]
)
RETURNS TABLE (id bigint, slot smallint)
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
DECLARE
    v_taken jsonb;
    v_full text[];
    v_picked bigint[] := '{}';
    v_slots smallint[] := '{}';
    v_new bigint[];
    v_new_slots smallint[];
    v_new_keys text[];
    v_seen integer;
    v_window integer := p_room * 4;
BEGIN
    SELECT COALESCE(jsonb_object_agg(s.ckey, s.n), '{}'::jsonb) INTO v_taken FROM (
        SELECT j.concurrency_key AS ckey, count(*) AS n FROM awa.active_jobs AS j
        WHERE j.state = 'running' AND j.queue = p_queue AND j.concurrency_key IS NOT NULL
        GROUP BY j.concurrency_key
    ) AS s;
    FOR v_pass IN 1..4 LOOP
        v_full := ARRAY(
            SELECT t.ckey FROM jsonb_each_text(v_taken) AS t(ckey, n)
            WHERE t.n::integer >= p_key_concurrency
        );
        WITH candidates AS MATERIALIZED (
            SELECT c.* FROM (
                SELECT l.* FROM (
                    SELECT a.id, a.slot, a.concurrency_key AS ckey, a.priority, a.run_at
                    FROM awa.active_jobs AS a
                    WHERE a.state = 'available' AND a.queue = p_queue AND a.priority = 1
                      AND a.run_at <= now()
                      AND (a.run_at, a.id)
                          >= (awa.position_at(p_after_us[1]), coalesce(p_after_id[1], 0))
                      AND a.kind = ANY(p_kinds) AND NOT (a.id = ANY(v_picked))
                      AND (a.concurrency_key IS NULL OR NOT (a.concurrency_key = ANY(v_full)))
                    ORDER BY a.run_at, a.id
                    FOR UPDATE SKIP LOCKED) AS l
                UNION ALL
                SELECT l.* FROM (
                    SELECT a.id, a.slot, a.concurrency_key AS ckey, a.priority, a.run_at
                    FROM awa.active_jobs AS a
                    WHERE a.state = 'available' AND a.queue = p_queue AND a.priority = 2
                      AND a.run_at <= now()
                      AND (a.run_at, a.id)
                          >= (awa.position_at(p_after_us[2]), coalesce(p_after_id[2], 0))
                      AND a.kind = ANY(p_kinds) AND NOT (a.id = ANY(v_picked))
                      AND (a.concurrency_key IS NULL OR NOT (a.concurrency_key = ANY(v_full)))
                    ORDER BY a.run_at, a.id
                    FOR UPDATE SKIP LOCKED) AS l
                UNION ALL
                SELECT l.* FROM (
                    SELECT a.id, a.slot, a.concurrency_key AS ckey, a.priority, a.run_at
                    FROM awa.active_jobs AS a
                    WHERE a.state = 'available' AND a.queue = p_queue AND a.priority = 3
                      AND a.run_at <= now()
                      AND (a.run_at, a.id)
                          >= (awa.position_at(p_after_us[3]), coalesce(p_after_id[3], 0))
                      AND a.kind = ANY(p_kinds) AND NOT (a.id = ANY(v_picked))
                      AND (a.concurrency_key IS NULL OR NOT (a.concurrency_key = ANY(v_full)))
                    ORDER BY a.run_at, a.id
                    FOR UPDATE SKIP LOCKED) AS l
                UNION ALL
                SELECT l.* FROM (
                    SELECT a.id, a.slot, a.concurrency_key AS ckey, a.priority, a.run_at
                    FROM awa.active_jobs AS a
                    WHERE a.state = 'available' AND a.queue = p_queue AND a.priority = 4
                      AND a.run_at <= now()
                      AND (a.run_at, a.id)
                          >= (awa.position_at(p_after_us[4]), coalesce(p_after_id[4], 0))
                      AND a.kind = ANY(p_kinds) AND NOT (a.id = ANY(v_picked))
                      AND (a.concurrency_key IS NULL OR NOT (a.concurrency_key = ANY(v_full)))
                    ORDER BY a.run_at, a.id
                    FOR UPDATE SKIP LOCKED) AS l
            ) AS c
            LIMIT v_window
        ), chosen AS MATERIALIZED (
            SELECT r.id, r.slot, r.ckey FROM (
                SELECT c.*, row_number() OVER (
                    PARTITION BY c.ckey ORDER BY c.priority, c.run_at, c.id
                ) AS rank
                FROM candidates AS c
            ) AS r
            WHERE r.ckey IS NULL
               OR r.rank <= p_key_concurrency - COALESCE((v_taken ->> r.ckey)::integer, 0)
            ORDER BY r.priority, r.run_at, r.id
            LIMIT p_room - cardinality(v_picked)
        )
        SELECT (SELECT count(*) FROM candidates),
               COALESCE((SELECT array_agg(ch.id) FROM chosen AS ch), '{}'),
               COALESCE((SELECT array_agg(ch.slot) FROM chosen AS ch), '{}'),
               COALESCE((SELECT array_agg(ch.ckey) FROM chosen AS ch WHERE ch.ckey IS NOT NULL),
                        '{}')
        INTO v_seen, v_new, v_new_slots, v_new_keys;
        v_picked := v_picked || v_new;
        v_slots := v_slots || v_new_slots;
        SELECT v_taken || COALESCE(jsonb_object_agg(
            k.ckey, COALESCE((v_taken ->> k.ckey)::integer, 0) + k.n
        ), '{}'::jsonb) INTO v_taken
        FROM (SELECT u.ckey, count(*) AS n FROM unnest(v_new_keys) AS u(ckey) GROUP BY u.ckey) AS k;
        EXIT WHEN cardinality(v_picked) >= p_room OR v_seen < v_window;
        v_window := v_window * 4;
    END LOOP;
    RETURN QUERY SELECT p.id, p.slot FROM unnest(v_picked, v_slots) AS p(id, slot);
END
$$;

-- The claim of a queue with limits (migration 4's function, on active_jobs and from the
-- claimer's lane positions: see the claim_jobs query). The queue's limits row is locked
-- first, and only then is the claim run, as a statement of its own, so that it sees every
-- claim committed before the lock was granted. Returns the claimed rows (the columns of
-- claim_jobs) and, in retry_after, how long to wait before asking again when a limit held
-- jobs back; a row of NULLs carries it when nothing was claimed. It reads every lane from
-- the position the claimer gives (p_after_us, p_after_id: one element per priority, NULL
-- for the head of the lane), and takes only the kinds the claimer has handlers for (p_kinds):
-- a job of another kind waits for a worker that runs it.
DROP FUNCTION awa.claim_limited(text, integer, interval, double precision, integer, integer,
                                integer);
DROP FUNCTION awa.pick_keyed(text, integer, integer);
CREATE FUNCTION awa.claim_limited(
    p_queue text, p_limit integer, p_deadline interval, p_rate double precision,
    p_burst integer, p_max_running integer, p_key_concurrency integer,
    p_after_us bigint[], p_after_id bigint[], p_kinds text[]
)
RETURNS TABLE (
    id bigint, kind text, queue text, args jsonb, priority smallint, attempt smallint,
    max_attempts smallint, run_lease bigint, run_at double precision,
    created_at double precision, attempted_at double precision, deadline_at double precision,
    errors jsonb, metadata jsonb, tags text[], progress jsonb, deadline_duration interval,
    unique_key bytea, unique_states smallint, ordering_key bytea, callback_id uuid,
    callback_timeout_at double precision, callback_filter text, callback_on_complete text,
    callback_on_fail text, callback_transform text, concurrency_key text,
    retry_after double precision
)
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
DECLARE
    lim awa.queue_limits%ROWTYPE;
    v_room integer := p_limit;
    v_tokens double precision;
    v_running integer;
    v_wait double precision;
    v_wait_if_used double precision;
    v_claimed integer;
    v_ids bigint[];
    v_slots smallint[];
    v_now timestamptz;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT * INTO lim FROM awa.queue_limits AS l WHERE l.queue = p_queue FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO awa.queue_limits AS l (queue, rate, burst, max_running, key_concurrency,
                                           tokens)
        VALUES (p_queue, p_rate, p_burst, p_max_running, p_key_concurrency,
                COALESCE(p_burst, 0))
        ON CONFLICT ON CONSTRAINT queue_limits_pkey DO NOTHING;
        SELECT * INTO lim FROM awa.queue_limits AS l WHERE l.queue = p_queue FOR UPDATE;
    END IF;
    IF EXISTS (SELECT 1 FROM awa.queues AS q WHERE q.queue = p_queue AND q.paused) THEN
        RETURN;
    END IF;
    IF p_rate IS NOT NULL THEN
        v_now := clock_timestamp();
        v_tokens := least(
            p_burst,
            lim.tokens + extract(epoch FROM v_now - lim.tokens_at) * p_rate
        );
        IF floor(v_tokens) <= v_room THEN
            v_room := floor(v_tokens)::integer;
            v_wait_if_used := 0;
        END IF;
        IF v_room < 1 THEN
            v_wait := (1 - v_tokens) / p_rate;
        END IF;
    END IF;
    IF p_max_running IS NOT NULL AND v_room > 0 THEN
        SELECT count(*) INTO v_running FROM awa.active_jobs AS j
        WHERE j.state = 'running' AND j.queue = p_queue;
        IF v_running >= p_max_running THEN
            v_room := 0;
            v_wait := 0.05;
        ELSIF p_max_running - v_running <= v_room THEN
            v_room := p_max_running - v_running;
            v_wait_if_used := 0.05;
        END IF;
    END IF;
    IF v_room > 0 THEN
        IF p_key_concurrency IS NULL THEN
            SELECT array_agg(c.id), array_agg(c.slot) INTO v_ids, v_slots FROM (
                SELECT l.id, l.slot FROM (
                    SELECT a.id, a.slot FROM awa.active_jobs AS a
                    WHERE a.state = 'available' AND a.queue = p_queue AND a.priority = 1
                      AND a.run_at <= now() AND a.kind = ANY(p_kinds)
                      AND (a.run_at, a.id)
                          >= (awa.position_at(p_after_us[1]), coalesce(p_after_id[1], 0))
                    ORDER BY a.run_at, a.id
                    FOR UPDATE SKIP LOCKED) AS l
                UNION ALL
                SELECT l.id, l.slot FROM (
                    SELECT a.id, a.slot FROM awa.active_jobs AS a
                    WHERE a.state = 'available' AND a.queue = p_queue AND a.priority = 2
                      AND a.run_at <= now() AND a.kind = ANY(p_kinds)
                      AND (a.run_at, a.id)
                          >= (awa.position_at(p_after_us[2]), coalesce(p_after_id[2], 0))
                    ORDER BY a.run_at, a.id
                    FOR UPDATE SKIP LOCKED) AS l
                UNION ALL
                SELECT l.id, l.slot FROM (
                    SELECT a.id, a.slot FROM awa.active_jobs AS a
                    WHERE a.state = 'available' AND a.queue = p_queue AND a.priority = 3
                      AND a.run_at <= now() AND a.kind = ANY(p_kinds)
                      AND (a.run_at, a.id)
                          >= (awa.position_at(p_after_us[3]), coalesce(p_after_id[3], 0))
                    ORDER BY a.run_at, a.id
                    FOR UPDATE SKIP LOCKED) AS l
                UNION ALL
                SELECT l.id, l.slot FROM (
                    SELECT a.id, a.slot FROM awa.active_jobs AS a
                    WHERE a.state = 'available' AND a.queue = p_queue AND a.priority = 4
                      AND a.run_at <= now() AND a.kind = ANY(p_kinds)
                      AND (a.run_at, a.id)
                          >= (awa.position_at(p_after_us[4]), coalesce(p_after_id[4], 0))
                    ORDER BY a.run_at, a.id
                    FOR UPDATE SKIP LOCKED) AS l
                LIMIT v_room
            ) AS c;
        ELSE
            SELECT array_agg(k.id), array_agg(k.slot) INTO v_ids, v_slots
            FROM awa.pick_keyed(p_queue, v_room, p_key_concurrency, p_after_us, p_after_id,
                                p_kinds) AS k;
        END IF;
        RETURN QUERY
        UPDATE awa.active_jobs AS j
        SET state = 'running',
            attempt = j.attempt + 1,
            run_lease = j.run_lease + 1,
            attempted_at = now(),
            heartbeat_at = now(),
            deadline_at = CASE
                WHEN COALESCE(j.deadline_duration, p_deadline) > interval '0'
                THEN now() + COALESCE(j.deadline_duration, p_deadline)
            END
        WHERE j.id = ANY(v_ids) AND j.slot = ANY(v_slots) AND j.state::text = 'available'
        RETURNING j.id, j.kind, j.queue, j.args, j.priority, j.attempt, j.max_attempts,
                  j.run_lease,
                  date_part('epoch', j.run_at),
                  date_part('epoch', j.created_at),
                  date_part('epoch', j.attempted_at),
                  date_part('epoch', j.deadline_at),
                  NULLIF(j.errors, '[]'::jsonb), NULLIF(j.metadata, '{}'::jsonb), j.tags,
                  j.progress, j.deadline_duration, j.unique_key, j.unique_states,
                  j.ordering_key, j.callback_id,
                  date_part('epoch', j.callback_timeout_at), j.callback_filter,
                  j.callback_on_complete, j.callback_on_fail, j.callback_transform,
                  j.concurrency_key, NULL::float8;
        GET DIAGNOSTICS v_claimed = ROW_COUNT;
        IF v_claimed = v_room AND v_wait_if_used IS NOT NULL THEN
            v_wait := CASE
                WHEN v_wait_if_used = 0 THEN greatest(1 - (v_tokens - v_claimed), 0) / p_rate
                ELSE v_wait_if_used
            END;
        ELSIF v_claimed < v_room AND p_key_concurrency IS NOT NULL AND EXISTS (
            SELECT 1 FROM awa.active_jobs AS j
            WHERE j.state = 'available' AND j.queue = p_queue AND j.run_at <= now()
              AND j.kind = ANY(p_kinds)
        ) THEN
            v_wait := 0.05;
        END IF;
    ELSE
        v_claimed := 0;
    END IF;
    IF p_rate IS NOT NULL THEN
        UPDATE awa.queue_limits AS l
        SET tokens = v_tokens - v_claimed, tokens_at = v_now
        WHERE l.queue = p_queue;
    END IF;
    IF v_wait IS NOT NULL THEN
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::jsonb,
            NULL::smallint, NULL::smallint, NULL::smallint, NULL::bigint, NULL::float8,
            NULL::float8, NULL::float8, NULL::float8, NULL::jsonb, NULL::jsonb, NULL::text[],
            NULL::jsonb, NULL::interval, NULL::bytea, NULL::smallint, NULL::bytea, NULL::uuid,
            NULL::float8, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text,
            v_wait;
    END IF;
END
$$;

-- A job row, given as JSON (to_jsonb of a row of any home, with changed columns merged in),
-- as a row of each home. Moves off the hot path go through these: every column travels,
-- whatever later migrations add. JSON null in progress or output becomes SQL NULL again; a
-- ring's row takes the ring's current slot.
CREATE FUNCTION awa.as_held(j jsonb) RETURNS awa.held_jobs
LANGUAGE plpgsql STABLE AS $$
DECLARE
    r awa.held_jobs;
BEGIN
    r := jsonb_populate_record(NULL::awa.held_jobs, j);
    r.progress := NULLIF(r.progress, 'null'::jsonb);
    r.output := NULLIF(r.output, 'null'::jsonb);
    RETURN r;
END
$$;

CREATE FUNCTION awa.as_active(j jsonb) RETURNS awa.active_jobs
LANGUAGE plpgsql STABLE AS $$
DECLARE
    r awa.active_jobs;
BEGIN
    r := jsonb_populate_record(NULL::awa.active_jobs, j);
    r.progress := NULLIF(r.progress, 'null'::jsonb);
    r.output := NULLIF(r.output, 'null'::jsonb);
    r.slot := awa.active_slot();
    RETURN r;
END
$$;

CREATE FUNCTION awa.as_done(j jsonb) RETURNS awa.done_jobs
LANGUAGE plpgsql STABLE AS $$
DECLARE
    r awa.done_jobs;
BEGIN
    r := jsonb_populate_record(NULL::awa.done_jobs, j);
    r.progress := NULLIF(r.progress, 'null'::jsonb);
    r.output := NULLIF(r.output, 'null'::jsonb);
    r.slot := awa.done_slot();
    RETURN r;
END
$$;

-- The same, shaped as the read model's row (what statements return to the worker and the
-- clients).
CREATE FUNCTION awa.as_job(j jsonb) RETURNS awa.jobs
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    r awa.jobs;
BEGIN
    r := jsonb_populate_record(NULL::awa.jobs, j);
    r.progress := NULLIF(r.progress, 'null'::jsonb);
    r.output := NULLIF(r.output, 'null'::jsonb);
    RETURN r;
END
$$;

-- A statement reads every home in one snapshot, so a job moved between homes after that
-- snapshot (a handler parking, a resume, a claim, a completion) is found in neither: the
-- lookups that lock a job before changing it read each home in a statement of its own, and
-- look again when the job was moving, then change it in a later statement, which sees where
-- it is now (the lock keeps it there).

-- The job holding a callback id in one of the given states, locked, as a read-model row
-- (NULL: none).
CREATE FUNCTION awa.locked_callback_job(
    p_callback uuid, p_lease bigint, p_states awa.job_state[]
) RETURNS awa.jobs
LANGUAGE plpgsql AS $$
DECLARE
    r jsonb;
BEGIN
    FOR v_attempt IN 1..5 LOOP
        -- Running jobs (through the running index: no index of active_jobs has callback_id).
        SELECT to_jsonb(j) INTO r FROM awa.active_jobs AS j
        WHERE j.state = 'running' AND 'running' = ANY(p_states)
          AND j.callback_id = p_callback AND (p_lease IS NULL OR j.run_lease = p_lease)
        FOR UPDATE;
        IF FOUND THEN
            RETURN awa.as_job(r);
        END IF;
        SELECT to_jsonb(j) INTO r FROM awa.held_jobs AS j
        WHERE j.callback_id = p_callback AND j.state = ANY(p_states)
          AND (p_lease IS NULL OR j.run_lease = p_lease)
        FOR UPDATE;
        IF FOUND THEN
            RETURN awa.as_job(r);
        END IF;
        EXIT WHEN NOT EXISTS (
            SELECT 1 FROM awa.active_jobs AS j
            WHERE j.state = 'running' AND j.callback_id = p_callback
        ) AND NOT EXISTS (SELECT 1 FROM awa.held_jobs AS j WHERE j.callback_id = p_callback);
    END LOOP;
    RETURN NULL;
END
$$;

-- The given jobs that are in one of the given states, locked (in id order within each
-- home), with their state as locked.
CREATE FUNCTION awa.locked_jobs(p_ids bigint[], p_states awa.job_state[])
RETURNS TABLE (id bigint, state awa.job_state)
LANGUAGE plpgsql AS $$
DECLARE
    v_found bigint[] := '{}';
    v_missing bigint[] := p_ids;
    v_rows record;
BEGIN
    FOR v_attempt IN 1..5 LOOP
        FOR v_rows IN
            SELECT j.id, j.state FROM awa.active_jobs AS j
            WHERE j.id = ANY(v_missing) AND j.state = ANY(p_states)
            ORDER BY j.id FOR UPDATE
        LOOP
            id := v_rows.id; state := v_rows.state; v_found := v_found || v_rows.id;
            RETURN NEXT;
        END LOOP;
        FOR v_rows IN
            SELECT j.id, j.state FROM awa.held_jobs AS j
            WHERE j.id = ANY(v_missing) AND NOT (j.id = ANY(v_found))
              AND j.state = ANY(p_states)
            ORDER BY j.id FOR UPDATE
        LOOP
            id := v_rows.id; state := v_rows.state; v_found := v_found || v_rows.id;
            RETURN NEXT;
        END LOOP;
        FOR v_rows IN
            SELECT j.id, j.state FROM awa.done_jobs AS j
            WHERE j.id = ANY(v_missing) AND NOT (j.id = ANY(v_found))
              AND j.state = ANY(p_states)
            ORDER BY j.id FOR UPDATE
        LOOP
            id := v_rows.id; state := v_rows.state; v_found := v_found || v_rows.id;
            RETURN NEXT;
        END LOOP;
        -- Ids found nowhere in a matching state: gone or in another state, unless they
        -- were moving between two of the reads above.
        v_missing := ARRAY(
            SELECT m FROM unnest(v_missing) AS m
            WHERE NOT (m = ANY(v_found))
              AND EXISTS (SELECT 1 FROM awa.jobs AS j WHERE j.id = m AND j.state = ANY(p_states))
        );
        EXIT WHEN cardinality(v_missing) = 0;
    END LOOP;
END
$$;

-- Cancel the given jobs that have not finished; returns each cancelled row with the state
-- it had. p_error, when given, is appended to the job's errors.
CREATE FUNCTION awa.cancel_jobs(p_ids bigint[], p_error text)
RETURNS TABLE (job awa.jobs, prior_state awa.job_state)
LANGUAGE plpgsql AS $$
DECLARE
    v_prior jsonb;
BEGIN
    SELECT COALESCE(jsonb_object_agg(l.id::text, l.state), '{}') INTO v_prior
    FROM awa.locked_jobs(
        p_ids, ARRAY['scheduled', 'available', 'running', 'retryable', 'waiting_external',
                     'blocked']::awa.job_state[]
    ) AS l;
    RETURN QUERY
    WITH cancelled AS (
        UPDATE awa.jobs AS j
        SET state = 'cancelled', finalized_at = now(), heartbeat_at = NULL, deadline_at = NULL,
            callback_id = NULL, callback_timeout_at = NULL, callback_filter = NULL,
            callback_on_complete = NULL, callback_on_fail = NULL, callback_transform = NULL,
            errors = CASE WHEN p_error IS NULL THEN j.errors
                          ELSE j.errors || jsonb_build_array(jsonb_build_object(
                              'error', p_error, 'attempt', j.attempt, 'at', now())) END
        WHERE j.id = ANY(ARRAY(SELECT k::bigint FROM jsonb_object_keys(v_prior) AS k))
        RETURNING j.*
    )
    SELECT c::awa.jobs, (v_prior ->> c.id::text)::awa.job_state FROM cancelled AS c;
END
$$;

-- Callback resolutions: the job holding the callback, locked, then changed (through the
-- view, which moves it to the home of its new state).
CREATE FUNCTION awa.complete_callback_job(p_callback uuid, p_lease bigint, p_payload jsonb)
RETURNS SETOF awa.jobs
LANGUAGE plpgsql AS $$
DECLARE
    v_job awa.jobs := awa.locked_callback_job(
        p_callback, p_lease, ARRAY['waiting_external', 'running']::awa.job_state[]);
BEGIN
    IF v_job.id IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    UPDATE awa.jobs AS j
    SET state = 'completed', finalized_at = now(), heartbeat_at = NULL, deadline_at = NULL,
        progress = NULL, output = COALESCE(p_payload, j.output),
        callback_id = NULL, callback_timeout_at = NULL, callback_filter = NULL,
        callback_on_complete = NULL, callback_on_fail = NULL, callback_transform = NULL,
        callback_in_handler = false
    WHERE j.id = v_job.id
    RETURNING j.*;
END
$$;

CREATE FUNCTION awa.fail_callback_job(
    p_callback uuid, p_lease bigint, p_error text, p_expression text
) RETURNS SETOF awa.jobs
LANGUAGE plpgsql AS $$
DECLARE
    v_job awa.jobs := awa.locked_callback_job(
        p_callback, p_lease, ARRAY['waiting_external', 'running']::awa.job_state[]);
BEGIN
    IF v_job.id IS NULL THEN
        RETURN;
    END IF;
    -- A running job moves to held_jobs as it fails: the dead-letter move (a trigger)
    -- learns from awa.callback_failed that a callback failed it.
    PERFORM set_config('awa.callback_failed', v_job.id::text, true);
    RETURN QUERY
    UPDATE awa.jobs AS j
    SET state = 'failed', finalized_at = now(), heartbeat_at = NULL, deadline_at = NULL,
        errors = j.errors || jsonb_build_array(
            jsonb_build_object('error', p_error, 'attempt', j.attempt, 'at', now(),
                               'terminal', true)
            || CASE WHEN p_expression IS NULL THEN '{}'::jsonb
                    ELSE jsonb_build_object('expression', p_expression) END),
        callback_id = NULL, callback_timeout_at = NULL, callback_filter = NULL,
        callback_on_complete = NULL, callback_on_fail = NULL, callback_transform = NULL,
        callback_in_handler = false
    WHERE j.id = v_job.id
    RETURNING j.*;
END
$$;

-- Parked jobs only: the job runs again from a fresh attempt budget; also returns the
-- attempt that parked, for the Retried event.
CREATE FUNCTION awa.retry_callback_job(p_callback uuid, p_lease bigint)
RETURNS TABLE (job awa.jobs, parked_attempt smallint)
LANGUAGE plpgsql AS $$
DECLARE
    v_job awa.jobs := awa.locked_callback_job(
        p_callback, p_lease, ARRAY['waiting_external']::awa.job_state[]);
BEGIN
    IF v_job.id IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH retried AS (
        UPDATE awa.jobs AS j
        SET state = 'available', attempt = 0, run_at = now(), finalized_at = NULL,
            heartbeat_at = NULL, deadline_at = NULL,
            callback_id = NULL, callback_timeout_at = NULL, callback_filter = NULL,
            callback_on_complete = NULL, callback_on_fail = NULL, callback_transform = NULL,
            callback_in_handler = false
        WHERE j.id = v_job.id
        RETURNING j.*
    )
    SELECT r::awa.jobs, v_job.attempt FROM retried AS r;
END
$$;

-- Hands a payload to the job (see the resume_callback query for what follows).
CREATE FUNCTION awa.resume_callback_job(p_callback uuid, p_lease bigint, p_payload jsonb)
RETURNS SETOF awa.jobs
LANGUAGE plpgsql AS $$
DECLARE
    v_job awa.jobs := awa.locked_callback_job(
        p_callback, p_lease, ARRAY['waiting_external', 'running']::awa.job_state[]);
    v_requeue boolean;
BEGIN
    IF v_job.id IS NULL THEN
        RETURN;
    END IF;
    v_requeue := v_job.state::text = 'waiting_external' AND NOT v_job.callback_in_handler;
    RETURN QUERY
    UPDATE awa.jobs AS j
    SET state = (CASE WHEN v_requeue THEN 'available' ELSE 'running' END)::awa.job_state,
        attempt = CASE WHEN v_requeue THEN j.attempt - 1 ELSE j.attempt END,
        run_at = CASE WHEN v_requeue THEN now() ELSE j.run_at END,
        heartbeat_at = CASE WHEN v_requeue THEN NULL ELSE now() END,
        callback_id = NULL, callback_timeout_at = NULL, callback_filter = NULL,
        callback_on_complete = NULL, callback_on_fail = NULL, callback_transform = NULL,
        callback_in_handler = false,
        metadata = jsonb_set(j.metadata, '{_awa_callback_result}',
                             COALESCE(p_payload, 'null'::jsonb))
    WHERE j.id = v_job.id
    RETURNING j.*;
END
$$;

-- Rotation of the active ring (the leader, every second or so). Once the current slot has
-- been current for p_min_age, the slot sealed longest ago whose live rows (available and
-- running jobs) number at most p_max_move becomes current: its live rows move to the
-- current slot (their lane positions unchanged, so unannounced), then it is truncated,
-- which frees the dead versions every claim and completion left in it whatever snapshot is
-- held. A slot holding a bigger backlog is left until it drains; a slot that another
-- transaction holds a lock on (a long read of the view) is skipped after p_lock_timeout
-- (claims queue behind the lock request meanwhile: it must be short). The caller runs it as
-- a statement of its own, so that the slot's lock is released the moment it is done.
-- Truncating is not MVCC-safe: a snapshot older than the truncation that reads
-- the slot afterwards sees it empty (pg_dump holds its locks from the start, so rotation
-- waits for it instead). Returns what it did, for the log.
CREATE FUNCTION awa.rotate_active_ring(
    p_min_age interval, p_max_move integer, p_lock_timeout text
) RETURNS text
LANGUAGE plpgsql
-- Truncating takes the owner's rights: a worker role needs no TRUNCATE privilege.
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_current smallint := awa.active_slot();
    v_opened timestamptz;
    v_target smallint;
    v_live integer;
BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
    SELECT s.opened_at INTO v_opened FROM awa.storage_slots AS s
    WHERE s.ring = 'active' AND s.slot = v_current
    FOR UPDATE;
    IF now() - v_opened < p_min_age THEN
        RETURN NULL;
    END IF;
    FOR v_target IN
        SELECT s.slot FROM awa.storage_slots AS s
        WHERE s.ring = 'active' AND s.slot <> v_current
        ORDER BY s.sealed_at NULLS FIRST, s.slot
    LOOP
        -- Counted first without a lock (claims go on), then again under it.
        EXECUTE format('SELECT count(*) FROM (SELECT 1 FROM awa.active_jobs_%s LIMIT %s) AS l',
                       v_target, p_max_move + 1)
            INTO v_live;
        CONTINUE WHEN v_live > p_max_move;
        BEGIN
            EXECUTE format('LOCK TABLE awa.active_jobs_%s IN ACCESS EXCLUSIVE MODE', v_target);
        EXCEPTION WHEN lock_not_available THEN
            CONTINUE;
        END;
        EXECUTE format('SELECT count(*) FROM (SELECT 1 FROM awa.active_jobs_%s LIMIT %s) AS l',
                       v_target, p_max_move + 1)
            INTO v_live;
        CONTINUE WHEN v_live > p_max_move;
        PERFORM set_config('awa.storage_move', 'on', true);
        UPDATE awa.active_jobs AS j SET slot = v_current WHERE j.slot = v_target;
        PERFORM set_config('awa.storage_move', 'off', true);
        EXECUTE format('TRUNCATE awa.active_jobs_%s', v_target);
        UPDATE awa.storage_slots AS s SET sealed_at = now()
        WHERE s.ring = 'active' AND s.slot = v_current;
        UPDATE awa.storage_slots AS s SET opened_at = now(), sealed_at = NULL
        WHERE s.ring = 'active' AND s.slot = v_target;
        PERFORM setval('awa.active_slot', v_target);
        RETURN format('active ring: slot %s current (was %s), %s live job(s) moved',
                      v_target, v_current, v_live);
    END LOOP;
    RETURN format('active ring: no slot could be freed (slot %s stays current)', v_current);
END
$$;

-- Rotation and retention of the done ring (the leader's retention duty). Completed jobs are
-- kept for p_retention at least: the current slot takes new completions for p_width, then
-- the next slot in ring order becomes current once everything in it is older than the
-- retention. Before that slot is truncated, its jobs of queues that keep completed jobs
-- longer (awa.queue_retention) and are not yet past it move to the current slot, and the
-- unique keys of the others are freed. Returns what it did, or NULL.
CREATE FUNCTION awa.rotate_done_ring(
    p_width interval, p_retention interval, p_lock_timeout text
) RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_current smallint := awa.done_slot();
    v_opened timestamptz;
    v_target smallint := (awa.done_slot() + 1) % 8;
    v_sealed timestamptz;
    v_kept integer;
BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
    SELECT s.opened_at INTO v_opened FROM awa.storage_slots AS s
    WHERE s.ring = 'done' AND s.slot = v_current
    FOR UPDATE;
    IF now() - v_opened < p_width THEN
        RETURN NULL;
    END IF;
    SELECT s.sealed_at INTO v_sealed FROM awa.storage_slots AS s
    WHERE s.ring = 'done' AND s.slot = v_target;
    IF v_sealed > now() - p_retention THEN
        RETURN NULL;  -- its jobs are not all past their retention yet
    END IF;
    BEGIN
        EXECUTE format('LOCK TABLE awa.done_jobs_%s, awa.done_counts_%s IN ACCESS EXCLUSIVE MODE',
                       v_target, v_target);
    EXCEPTION WHEN lock_not_available THEN
        RETURN NULL;
    END;
    -- Their counts move with them (a trigger); the truncated slot's counts go.
    UPDATE awa.done_jobs AS j SET slot = v_current
    FROM awa.queue_retention AS r
    WHERE j.slot = v_target AND r.queue = j.queue
      AND r.completed_seconds > extract(epoch FROM p_retention)
      AND j.finalized_at > now() - make_interval(secs => r.completed_seconds);
    GET DIAGNOSTICS v_kept = ROW_COUNT;
    EXECUTE format(
        'DELETE FROM awa.unique_keys AS k USING awa.done_jobs_%s AS d'
        ' WHERE d.unique_key IS NOT NULL AND k.unique_key = d.unique_key AND k.job_id = d.id',
        v_target);
    EXECUTE format('TRUNCATE awa.done_jobs_%s, awa.done_counts_%s', v_target, v_target);
    UPDATE awa.storage_slots AS s SET sealed_at = now()
    WHERE s.ring = 'done' AND s.slot = v_current;
    UPDATE awa.storage_slots AS s SET opened_at = now(), sealed_at = NULL
    WHERE s.ring = 'done' AND s.slot = v_target;
    PERFORM setval('awa.done_slot', v_target);
    RETURN format('done ring: slot %s truncated and current (was %s), %s job(s) kept longer',
                  v_target, v_current, v_kept);
END
$$;

-- Counts of completed jobs, exact and cheap whatever the size of done_jobs: triggers on
-- done_jobs append, for each statement, how many jobs it added to (or removed from) each
-- slot, queue and minute of finalized_at; a count sums these rows instead of reading every
-- completed job. They are only ever inserted, so a long snapshot leaves no dead version in
-- the completion's path; the leader folds each group of them into one row now and then
-- (awa.fold_done_counts). Like done_jobs, they are partitioned by slot, and a slot's
-- partition is truncated with it: the dead rows the folds leave go then, whatever snapshot
-- is held and whether or not autovacuum runs.
CREATE TABLE awa.done_counts (
    slot smallint NOT NULL,
    queue text NOT NULL,
    minute timestamptz NOT NULL,
    n bigint NOT NULL
) PARTITION BY LIST (slot);
DO $$
BEGIN
    FOR s IN 0..7 LOOP
        EXECUTE format(
            'CREATE TABLE awa.done_counts_%s PARTITION OF awa.done_counts FOR VALUES IN (%s)',
            s, s);
    END LOOP;
END
$$;

INSERT INTO awa.done_counts (slot, queue, minute, n)
SELECT d.slot, d.queue, date_trunc('minute', coalesce(d.finalized_at, now())), count(*)
FROM awa.done_jobs AS d
GROUP BY 1, 2, 3;

CREATE FUNCTION awa.count_added_done_jobs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO awa.done_counts (slot, queue, minute, n)
    SELECT a.slot, a.queue, date_trunc('minute', coalesce(a.finalized_at, now())), count(*)
    FROM added_jobs AS a
    GROUP BY 1, 2, 3;
    RETURN NULL;
END
$$;

CREATE FUNCTION awa.count_removed_done_jobs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO awa.done_counts (slot, queue, minute, n)
    SELECT r.slot, r.queue, date_trunc('minute', coalesce(r.finalized_at, now())), -count(*)
    FROM removed_jobs AS r
    GROUP BY 1, 2, 3;
    RETURN NULL;
END
$$;

CREATE TRIGGER done_jobs_count_insert
    AFTER INSERT ON awa.done_jobs
    REFERENCING NEW TABLE AS added_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION awa.count_added_done_jobs();

CREATE TRIGGER done_jobs_count_delete
    AFTER DELETE ON awa.done_jobs
    REFERENCING OLD TABLE AS removed_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION awa.count_removed_done_jobs();

-- An update that changes a row's slot, queue or finalized_at (rotation keeps a long-kept
-- job by moving it to the current slot) moves its count with it.
CREATE FUNCTION awa.count_changed_done_jobs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO awa.done_counts (slot, queue, minute, n)
    SELECT r.slot, r.queue, date_trunc('minute', coalesce(r.finalized_at, now())), -count(*)
    FROM removed_jobs AS r
    GROUP BY 1, 2, 3
    UNION ALL
    SELECT a.slot, a.queue, date_trunc('minute', coalesce(a.finalized_at, now())), count(*)
    FROM added_jobs AS a
    GROUP BY 1, 2, 3;
    RETURN NULL;
END
$$;

CREATE TRIGGER done_jobs_count_update
    AFTER UPDATE ON awa.done_jobs
    REFERENCING OLD TABLE AS removed_jobs NEW TABLE AS added_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION awa.count_changed_done_jobs();

-- Fold each group of count rows into one (the leader, with its queue sample).
CREATE FUNCTION awa.fold_done_counts() RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_folded bigint;
BEGIN
    WITH gone AS (
        DELETE FROM awa.done_counts AS c
        WHERE (c.slot, c.queue, c.minute) IN (
            SELECT g.slot, g.queue, g.minute FROM awa.done_counts AS g
            GROUP BY g.slot, g.queue, g.minute
            HAVING count(*) > 1
        )
        RETURNING c.*
    ), folded AS (
        INSERT INTO awa.done_counts (slot, queue, minute, n)
        SELECT g.slot, g.queue, g.minute, sum(g.n) FROM gone AS g
        GROUP BY g.slot, g.queue, g.minute
        HAVING sum(g.n) <> 0
    )
    SELECT count(*) INTO v_folded FROM gone;
    RETURN v_folded;
END
$$;

-- Completed jobs per queue: in all, and finalized at or after p_since (the minute p_since
-- falls in is read from done_jobs itself: an index range of at most a minute).
CREATE FUNCTION awa.completed_counts(p_since timestamptz)
RETURNS TABLE (queue text, total bigint, since bigint)
LANGUAGE sql STABLE AS $$
    WITH parts AS (
        SELECT c.queue, c.n AS total,
               CASE WHEN c.minute >= date_trunc('minute', p_since) + interval '1 minute'
                    THEN c.n ELSE 0 END AS since
        FROM awa.done_counts AS c
        UNION ALL
        SELECT d.queue, 0, 1 FROM awa.done_jobs AS d
        WHERE d.finalized_at >= p_since
          AND d.finalized_at < date_trunc('minute', p_since) + interval '1 minute'
    )
    SELECT p.queue, sum(p.total)::bigint, sum(p.since)::bigint
    FROM parts AS p
    GROUP BY p.queue
    HAVING sum(p.total) > 0
$$;
