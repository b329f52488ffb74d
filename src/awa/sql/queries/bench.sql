-- Statements of `awa bench`, which runs on its own scratch database only.

-- name: bench_database_comment
-- Whether a database of this name exists, and its comment: awa bench marks the scratch
-- databases it creates with a comment, and drops no database without it.
SELECT shobj_description(d.oid, 'pg_database') AS comment
FROM pg_database AS d
WHERE d.datname = %(name)s

-- name: bench_create_database
CREATE DATABASE {database}

-- name: bench_mark_database
COMMENT ON DATABASE {database} IS {mark}

-- name: bench_drop_database
-- Only ever run on a database that carries awa bench's mark.
DROP DATABASE IF EXISTS {database} WITH (FORCE)

-- name: bench_reset
TRUNCATE awa.active_jobs, awa.held_jobs, awa.done_jobs, awa.unique_keys, awa.queues,
    awa.queue_limits, awa.job_dependencies

-- name: bench_vacuum
VACUUM ANALYZE awa.active_jobs, awa.held_jobs, awa.done_jobs, awa.job_dependencies

-- name: bench_commits
SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()

-- name: bench_completed
SELECT count(*) FROM awa.jobs WHERE state = 'completed'

-- name: bench_dead_tuples
-- Every table of the job row's homes (the rings' slots too).
SELECT sum(n_dead_tup)::bigint AS n_dead_tup FROM pg_stat_user_tables
WHERE schemaname = 'awa' AND relname ~ '^(active_jobs|held_jobs|done_jobs)'

-- name: bench_raw_insert
-- The floor for one-by-one enqueue: a bare single-row INSERT into the table an available
-- job lives in, its own transaction.
INSERT INTO awa.active_jobs (kind, args) VALUES ('raw', '{}')

-- name: bench_raw_insert_returning
-- The producer of the latency floor: a bare INSERT that reports its id.
INSERT INTO awa.active_jobs (kind, args) VALUES ('raw', '{}') RETURNING id

-- name: bench_pin
-- The pin of the pinned scenarios: an xid and a snapshot, reading no table of awa's.
SELECT txid_current(), count(*) FROM pg_class

-- name: bench_queue_depth
SELECT count(*) FROM awa.active_jobs WHERE state = 'available'

-- name: bench_wal_lsn
SELECT pg_current_wal_lsn()::text

-- name: bench_wal_bytes_since
SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %(lsn)s::pg_lsn)

-- name: bench_dead_tuples_by_table
-- Dead tuples by home (the rings' slots summed) and the other tables of the hot path.
SELECT CASE WHEN relname LIKE 'active\_jobs\_%' THEN 'active_jobs'
            WHEN relname LIKE 'done\_jobs\_%' THEN 'done_jobs'
            WHEN relname LIKE 'done\_counts\_%' THEN 'done_counts'
            ELSE relname END AS home,
       sum(n_dead_tup)::bigint AS dead
FROM pg_stat_user_tables
WHERE schemaname = 'awa'
  AND (relname ~ '^(active_jobs|held_jobs|done_jobs|done_counts)'
       OR relname IN ('unique_keys', 'queues', 'queue_limits', 'storage_slots',
                      'runtimes', 'queue_samples'))
GROUP BY 1
ORDER BY 1

-- name: bench_table_sizes
-- Bytes on disk of each job home (the rings' slots summed), tables and indexes apart, and of
-- the tables beside them that grow with traffic.
SELECT CASE WHEN c.relname LIKE 'active\_jobs\_%' THEN 'active_jobs'
            WHEN c.relname LIKE 'done\_jobs\_%' THEN 'done_jobs'
            WHEN c.relname LIKE 'done\_counts\_%' THEN 'done_counts'
            ELSE c.relname END AS home,
       sum(pg_table_size(c.oid))::bigint AS table_bytes,
       sum(pg_indexes_size(c.oid))::bigint AS index_bytes
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'awa' AND c.relkind = 'r'
  AND (c.relname ~ '^(active_jobs|held_jobs|done_jobs|done_counts)_?'
       OR c.relname IN ('unique_keys', 'queue_samples'))
GROUP BY 1
ORDER BY 1
