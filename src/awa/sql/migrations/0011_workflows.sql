-- Workflows: jobs that wait for other jobs (dependencies, batches with one fan-in job), and
-- notifications when a watched job finishes (client.wait).
--
-- A job inserted with unfinished parents is 'blocked': no claim, promotion, rescue or
-- retention touches it. The transaction that commits a parent's final state settles its
-- children in the same transaction (a trigger): the last parent to complete releases a child
-- (available, or scheduled for a later run_at); a parent that fails or is cancelled cancels
-- the children whose policy is 'cancel' (and so, in turn, their own children), counts as done
-- for policy 'run', and leaves policy 'wait' children blocked until an operator acts. A crash
-- can neither lose nor repeat a release: it commits with the parent's outcome or not at all.
--
-- The new enum value cannot be used in the transaction that adds it, so nothing below names
-- it as an enum literal: comparisons go through state::text.

ALTER TYPE awa.job_state ADD VALUE IF NOT EXISTS 'blocked';

-- A blocked job holds its unique key like a scheduled one (it waits to run).
CREATE OR REPLACE FUNCTION awa.state_bit(s awa.job_state) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE s::text
        WHEN 'scheduled' THEN 0
        WHEN 'available' THEN 1
        WHEN 'running' THEN 2
        WHEN 'completed' THEN 3
        WHEN 'retryable' THEN 4
        WHEN 'failed' THEN 5
        WHEN 'cancelled' THEN 6
        WHEN 'waiting_external' THEN 7
        WHEN 'blocked' THEN 0
    END::smallint
$$;

ALTER TABLE awa.jobs
    -- The workflow or batch the job belongs to (client.insert_workflow, insert_batch).
    ADD COLUMN workflow_id uuid,
    -- Some job depends on this one: its final state settles them (the trigger's filter).
    ADD COLUMN has_dependents boolean NOT NULL DEFAULT false,
    -- Someone waits for this job (client.wait): its final state is announced on
    -- awa_finished.
    ADD COLUMN watched boolean NOT NULL DEFAULT false;

-- The dead-letter queue keeps the new columns too (migration 7's move copies every column):
-- a job retried from it comes back with its workflow and its dependents.
ALTER TABLE awa.dlq_entries
    ADD COLUMN workflow_id uuid,
    ADD COLUMN has_dependents boolean NOT NULL DEFAULT false,
    ADD COLUMN watched boolean NOT NULL DEFAULT false;


CREATE INDEX jobs_workflow_idx ON awa.jobs (workflow_id, id) WHERE workflow_id IS NOT NULL;

-- One row per (child, parent). No foreign keys: retention deletes parents before or after
-- their children; the leader removes edges whose child is gone.
CREATE TABLE awa.job_dependencies (
    child_id bigint NOT NULL,
    parent_id bigint NOT NULL,
    -- What the child does when this parent ends failed or cancelled.
    policy text NOT NULL CHECK (policy IN ('cancel', 'run', 'wait')),
    -- The parent's final state once it counts for the child (NULL: not yet).
    resolved text,
    PRIMARY KEY (child_id, parent_id)
);

CREATE INDEX job_dependencies_parent_idx ON awa.job_dependencies (parent_id);

-- Edges are inserted and resolved in bulk: keep their statistics fresh, as for awa.jobs.
ALTER TABLE awa.job_dependencies SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
);

-- Settle blocked children whose parents' edges changed: lock them in id order (two
-- transactions settling the same children wait for each other instead of deadlocking, and
-- the later one sees the earlier one's resolutions), then, in one statement for all of them,
-- cancel each child that a 'cancel' edge resolved as failed or cancelled (naming the first
-- such parent) and release each child with no unresolved edge (a batch's fan-in job also
-- receives its members' outcomes). Returns the ids of the children whose state it changed.
CREATE FUNCTION awa.settle_children(p_children bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
DECLARE
    locked bigint[];
BEGIN
    SELECT array_agg(l.id) INTO locked FROM (
        SELECT j.id FROM awa.jobs AS j
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
        UPDATE awa.jobs AS j
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
    ), released AS (
        UPDATE awa.jobs AS j
        SET state = CASE WHEN j.run_at <= now() THEN 'available' ELSE 'scheduled' END
                    ::awa.job_state,
            metadata = CASE WHEN j.metadata ? 'awa:fan_in' THEN j.metadata || jsonb_build_object(
                'awa:batch', (
                    SELECT jsonb_build_object(
                        'counts', jsonb_object_agg(s.resolved, s.n),
                        'ids', jsonb_object_agg(s.resolved, s.ids))
                    FROM (SELECT d.resolved, count(*) AS n,
                                 jsonb_agg(d.parent_id ORDER BY d.parent_id) AS ids
                          FROM awa.job_dependencies AS d
                          WHERE d.child_id = j.id
                          GROUP BY d.resolved) AS s))
                ELSE j.metadata END
        FROM ready AS r
        WHERE j.id = r.id
        RETURNING j.id, j.queue, j.state::text AS state
    ), notified AS (
        SELECT count(pg_notify('awa_jobs', q.queue)) AS n
        FROM (SELECT DISTINCT queue FROM released WHERE state = 'available') AS q
    )
    SELECT c.id FROM cancelled AS c
    UNION ALL
    SELECT r.id FROM released AS r CROSS JOIN notified;
END
$$;

-- Resolve the edges that these parents' final states settle (a failure does not settle a
-- 'wait' edge: that child waits for the parent to be retried, or for an operator), then
-- settle the children whose edges changed.
CREATE FUNCTION awa.settle_dependents(p_parents bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql
-- Index lookups whatever the statistics say: edges inserted by one big batch have none until
-- autovacuum analyzes the table, and a plan that scans it would be paid by every completion.
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

-- Row trigger: note the finished parents of the statement (a cheap filter: only rows flagged
-- has_dependents or watched reach the function), and announce watched jobs.
CREATE FUNCTION awa.note_finished_job() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.has_dependents THEN
        PERFORM set_config('awa.finished_parents',
                           coalesce(current_setting('awa.finished_parents', true), '')
                               || NEW.id::text || ',',
                           true);
    END IF;
    IF NEW.watched THEN
        PERFORM pg_notify('awa_finished', NEW.id::text);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_note_finished
    AFTER UPDATE OF state ON awa.jobs
    FOR EACH ROW
    WHEN ((NEW.has_dependents OR NEW.watched)
          AND NEW.state::text IN ('completed', 'failed', 'cancelled')
          AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION awa.note_finished_job();

-- A parent deleted before it finished (an operator's discard) will never complete: its
-- edges count as cancelled (a 'wait' edge keeps waiting, for an operator). Its children are
-- settled once the statement is done.
CREATE FUNCTION awa.note_deleted_parent() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    children text;
BEGIN
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

CREATE TRIGGER jobs_note_deleted_parent
    AFTER DELETE ON awa.jobs
    FOR EACH ROW
    WHEN (OLD.has_dependents OR OLD.watched)
    EXECUTE FUNCTION awa.note_deleted_parent();

-- Statement trigger: settle what the statement's rows noted once it is done. The cascade (a
-- cancelled child's own children) is settled here in a loop rather than by nested triggers,
-- so a long chain cannot exhaust the stack. The ids of the children it cancelled stay in
-- awa.cancelled_dependents for the rest of the transaction, so that the worker committing
-- the parent's outcome can fire their Cancelled hooks.
CREATE FUNCTION awa.settle_noted() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    parents text;
    children text;
    changed bigint[];
BEGIN
    IF pg_trigger_depth() > 1 THEN
        RETURN NULL;  -- inside a settlement: the outer loop takes what was noted
    END IF;
    LOOP
        parents := coalesce(current_setting('awa.finished_parents', true), '');
        children := coalesce(current_setting('awa.unsettled_children', true), '');
        EXIT WHEN parents = '' AND children = '';
        PERFORM set_config('awa.finished_parents', '', true);
        PERFORM set_config('awa.unsettled_children', '', true);
        SELECT array_agg(id) INTO changed FROM (
            SELECT awa.settle_dependents(string_to_array(rtrim(parents, ','), ',')::bigint[])
            WHERE parents <> ''
            UNION ALL
            SELECT awa.settle_children(string_to_array(rtrim(children, ','), ',')::bigint[])
            WHERE children <> ''
        ) AS settled(id);
        IF changed IS NOT NULL THEN
            PERFORM set_config('awa.cancelled_dependents',
                               coalesce(current_setting('awa.cancelled_dependents', true), '')
                                   || coalesce((SELECT string_agg(j.id::text, ',') || ','
                                                FROM awa.jobs AS j
                                                WHERE j.id = ANY(changed)
                                                  AND j.state::text = 'cancelled'), ''),
                               true);
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_settle_after_update
    AFTER UPDATE ON awa.jobs
    FOR EACH STATEMENT
    EXECUTE FUNCTION awa.settle_noted();

CREATE TRIGGER jobs_settle_after_delete
    AFTER DELETE ON awa.jobs
    FOR EACH STATEMENT
    EXECUTE FUNCTION awa.settle_noted();

-- Add edges from children (inserted in this transaction) to their parents, given as
-- parallel arrays (one element per edge), and put each child in the state its parents call
-- for: blocked while a parent is unfinished, cancelled at once when a parent already failed
-- under policy 'cancel', left as inserted (available or scheduled) when every parent is done.
-- Missing parents raise an error naming them. Parents are locked while flagged, so a parent
-- finishing concurrently either sees the edge or is seen finished here. Returns each
-- child's state.
CREATE FUNCTION awa.add_dependencies(
    p_children bigint[], p_parents bigint[], p_policies text[]
) RETURNS TABLE (child_id bigint, state text)
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
DECLARE
    missing bigint[];
    children bigint[];
BEGIN
    UPDATE awa.jobs AS j SET has_dependents = true
    WHERE j.id = ANY(p_parents) AND NOT j.has_dependents;
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
    UPDATE awa.jobs AS j SET state = 'blocked' WHERE j.id = ANY(children);
    PERFORM awa.settle_children(children);
    RETURN QUERY SELECT j.id, j.state::text FROM awa.jobs AS j WHERE j.id = ANY(children);
END
$$;
