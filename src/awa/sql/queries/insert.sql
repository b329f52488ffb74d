-- Producer inserts.

-- name: insert_jobs
-- Inserts every job described by one JSON array (one parameter, so the same statement runs
-- unchanged through psycopg, asyncpg, SQLAlchemy and Django). A job whose run_at lies in the
-- future (by the database clock) is scheduled; otherwise it is available at once.
-- A job whose unique key is already held is skipped (ON CONFLICT DO NOTHING waits for a
-- concurrent holder to commit, so two producers cannot both insert); the caller compares
-- the returned rows with what it sent to report the conflict.
-- Ids come from the identity in input order, so sorting the result by id restores it.
INSERT INTO awa.jobs (
    kind, queue, args, state, priority, max_attempts, run_at, metadata, tags,
    unique_key, unique_states, ordering_key, deadline_duration, concurrency_key
)
SELECT
    r.kind,
    r.queue,
    r.args,
    (CASE WHEN r.run_at > now() THEN 'scheduled' ELSE 'available' END)::awa.job_state,
    r.priority,
    r.max_attempts,
    COALESCE(r.run_at, now()),
    r.metadata,
    r.tags,
    decode(r.unique_key, 'hex'),
    r.unique_states,
    decode(r.ordering_key, 'hex'),
    make_interval(secs => r.deadline_seconds),
    r.concurrency_key
FROM jsonb_to_recordset(%(jobs)s::jsonb) AS r(
    kind text,
    queue text,
    args jsonb,
    priority smallint,
    max_attempts smallint,
    run_at timestamptz,
    metadata jsonb,
    tags text[],
    unique_key text,
    unique_states smallint,
    ordering_key text,
    deadline_seconds double precision,
    concurrency_key text
)
ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL
    AND awa.unique_key_held(unique_states, state)
DO NOTHING
-- Only what the database decided; the caller already knows every other column.
RETURNING id, state, run_at, created_at, unique_key

-- name: insert_job
-- One job, as a single-row VALUES with a parameter per column: cheaper for both sides than
-- the JSON form above (no JSON document to build and unpack), which matters when jobs are
-- inserted one at a time. Same rules: scheduled when run_at lies in the future by the
-- database clock, and no row when its unique key is already held.
INSERT INTO awa.jobs (
    kind, queue, args, state, priority, max_attempts, run_at, metadata, tags,
    unique_key, unique_states, ordering_key, deadline_duration, concurrency_key
)
VALUES (
    %(kind)s,
    %(queue)s,
    %(args)s::jsonb,
    (CASE WHEN %(run_at)s::timestamptz > now() THEN 'scheduled' ELSE 'available' END)::awa.job_state,
    %(priority)s,
    %(max_attempts)s,
    COALESCE(%(run_at)s::timestamptz, now()),
    %(metadata)s::jsonb,
    %(tags)s::text[],
    %(unique_key)s::bytea,
    %(unique_states)s,
    %(ordering_key)s::bytea,
    %(deadline_duration)s::interval,
    %(concurrency_key)s::text
)
ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL
    AND awa.unique_key_held(unique_states, state)
DO NOTHING
RETURNING id, state, run_at, created_at

-- name: insert_job_plain
-- insert_job for the common job: no run_at, unique key, tags, metadata, ordering key or
-- deadline, so the table's defaults apply (available now); fewer parameters to send, bind
-- and cast.
INSERT INTO awa.jobs (kind, queue, args, priority, max_attempts)
VALUES (%(kind)s, %(queue)s, %(args)s::jsonb, %(priority)s, %(max_attempts)s)
RETURNING id, state, run_at, created_at

-- name: unique_key_holders
SELECT id, unique_key FROM awa.jobs
WHERE unique_key = ANY(%(keys)s::bytea[]) AND awa.unique_key_held(unique_states, state)

-- name: copy_reserve_ids
-- Ids and the database clock for a COPY batch, fetched in the COPY's own transaction.
-- The sequence is looked up once (a materialized CTE): called per row, the lookup costs
-- ten times more than nextval itself.
WITH id_sequence AS MATERIALIZED (
    SELECT pg_get_serial_sequence('awa.jobs', 'id')::regclass AS seq
)
SELECT now() AS now,
       array(SELECT nextval(id_sequence.seq)
             FROM id_sequence, generate_series(1, %(count)s)) AS ids

-- name: copy_jobs
COPY awa.jobs (
    id, kind, queue, args, state, priority, max_attempts, run_at, created_at, metadata, tags,
    ordering_key, deadline_duration, concurrency_key
) FROM STDIN
