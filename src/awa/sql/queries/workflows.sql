-- Dependencies, workflows, batches and waiting for a job (migrations 11 and 12 hold the
-- triggers that settle dependents when their parents finish).

-- name: dependency_preflight
-- Before an insert with depends_on (or of a workflow): the parent ids that name no job now,
-- and, for a workflow id (NULL: neither), whether another transaction is inserting it
-- (busy: it holds the transaction-level lock taken here, two-key form so that it never meets
-- the single-key locks of migrations and leadership) or jobs of it exist already (taken).
-- A parent must exist before the insert, so a job can never name itself or another job of
-- the same insert.
SELECT COALESCE((SELECT array_agg(wanted ORDER BY wanted)
                 FROM unnest(%(parents)s::bigint[]) AS wanted
                 WHERE NOT EXISTS (SELECT 1 FROM awa.jobs AS j WHERE j.id = wanted)),
                '{}') AS missing,
       CASE WHEN %(workflow)s::uuid IS NULL THEN false
            ELSE NOT pg_try_advisory_xact_lock(1096237376, hashtext(%(workflow)s::text))
       END AS busy,
       CASE WHEN %(workflow)s::uuid IS NULL THEN false
            ELSE EXISTS (SELECT 1 FROM awa.jobs AS j WHERE j.workflow_id = %(workflow)s::uuid)
       END AS taken

-- name: add_dependencies
-- Edges from just-inserted jobs to their parents (one array element per edge); returns the
-- state they put each child in.
SELECT child_id, state
FROM awa.add_dependencies(%(children)s::bigint[], %(parents)s::bigint[], %(policies)s::text[])

-- name: set_workflow
-- Record the workflow (or batch) of freshly inserted jobs (available, scheduled or blocked:
-- in active_jobs or held_jobs), and count the jobs of the same workflow id that are not
-- these (committed by another transaction since the preflight: a statement later than the
-- preflight's lock sees them).
WITH active AS (
    UPDATE awa.active_jobs SET workflow_id = %(workflow)s WHERE id = ANY(%(ids)s::bigint[])
), held AS (
    UPDATE awa.held_jobs SET workflow_id = %(workflow)s WHERE id = ANY(%(ids)s::bigint[])
)
SELECT count(*) AS others
FROM awa.jobs
WHERE workflow_id = %(workflow)s AND NOT (id = ANY(%(ids)s::bigint[]))

-- name: workflow_jobs
-- Every job of a workflow, oldest first, with the ids it depends on.
SELECT j.*,
       COALESCE((SELECT array_agg(d.parent_id ORDER BY d.parent_id)
                 FROM awa.job_dependencies AS d WHERE d.child_id = j.id), '{}') AS depends_on
FROM awa.jobs AS j
WHERE j.workflow_id = %(workflow)s
ORDER BY j.id

-- name: cancel_workflow
-- Cancel every unfinished job of a workflow (blocked ones included). Running and parked
-- attempts are told through awa_cancel, as cancel_job does. Dependents settle by trigger.
WITH cancelled AS (
    SELECT (c.job).id, (c.job).run_lease, c.prior_state
    FROM awa.cancel_jobs(ARRAY(
        SELECT w.id FROM awa.jobs AS w
        WHERE w.workflow_id = %(workflow)s
          AND w.state NOT IN ('completed', 'failed', 'cancelled')
    ), 'cancelled: workflow cancelled') AS c
)
SELECT count(*) AS count,
       count(pg_notify('awa_cancel', json_build_object('job_id', c.id,
                                                       'run_lease', c.run_lease)::text))
           FILTER (WHERE c.prior_state IN ('running', 'waiting_external')) AS told
FROM cancelled AS c

-- name: watch_jobs
-- Mark the unfinished ones of these jobs watched (their final state is then announced on
-- awa_finished) and return every one of them as it is now (see awa.watch_jobs).
SELECT * FROM awa.watch_jobs(%(ids)s::bigint[])

-- name: prune_dependency_edges
-- Edges whose child is gone (retention deleted it), a bounded batch at a time.
DELETE FROM awa.job_dependencies
WHERE ctid IN (
    SELECT d.ctid FROM awa.job_dependencies AS d
    WHERE NOT EXISTS (SELECT 1 FROM awa.jobs AS j WHERE j.id = d.child_id)
    LIMIT %(limit)s
)

-- name: dependents_cancelled_with
-- The descendants a failed or cancelled job's transaction cancelled with it (their
-- finalized_at is that transaction's now()), for their Cancelled hooks.
WITH RECURSIVE below AS (
    SELECT d.child_id FROM awa.job_dependencies AS d WHERE d.parent_id = %(id)s
    UNION
    SELECT d.child_id FROM awa.job_dependencies AS d JOIN below AS b ON d.parent_id = b.child_id
)
SELECT j.* FROM awa.jobs AS j JOIN below AS b ON b.child_id = j.id
WHERE j.state = 'cancelled' AND j.finalized_at = %(finalized_at)s
ORDER BY j.id

-- name: jobs_by_ids
SELECT * FROM awa.jobs WHERE id = ANY(%(ids)s::bigint[]) ORDER BY id
