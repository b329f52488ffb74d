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
TRUNCATE awa.jobs, awa.queues, awa.queue_limits, awa.job_dependencies

-- name: bench_vacuum
VACUUM ANALYZE awa.jobs, awa.job_dependencies

-- name: bench_commits
SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()

-- name: bench_completed
SELECT count(*) FROM awa.jobs WHERE state = 'completed'

-- name: bench_dead_tuples
SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'awa.jobs'::regclass

-- name: bench_raw_insert
-- The floor for one-by-one enqueue: a bare single-row INSERT, its own transaction.
INSERT INTO awa.jobs (kind, args) VALUES ('raw', '{}')

-- name: bench_raw_insert_returning
-- The producer of the latency floor: a bare INSERT that reports its id.
INSERT INTO awa.jobs (kind, args) VALUES ('raw', '{}') RETURNING id
