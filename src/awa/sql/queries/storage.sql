-- The storage rings (migration 12): rotation of the active ring, and of the done ring with
-- retention. Run by the maintenance leader.

-- name: active_slot_writes
-- Rows written to the current slot of the active ring since the statistics began (inserts,
-- claims and heartbeats, completions): the leader rotates once enough have piled up.
SELECT awa.active_slot() AS slot,
       COALESCE((SELECT n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables
                 WHERE schemaname = 'awa'
                   AND relname = 'active_jobs_' || awa.active_slot()::text), 0) AS writes

-- name: rotate_active_ring
-- One statement, run alone (autocommit): the slot locks it takes end with it.
SELECT awa.rotate_active_ring(
    make_interval(secs => %(min_age)s), %(max_move)s, %(lock_timeout)s
) AS done

-- name: rotate_done_ring
SELECT awa.rotate_done_ring(
    make_interval(secs => %(width)s), make_interval(secs => %(retention)s), %(lock_timeout)s
) AS done

-- name: storage_status
-- What storage_status() reports: awa's one engine (migration 12), where it lives, the schema
-- version, when the engine's migration was applied, and the live worker runtimes.
SELECT awa.active_queue_storage_schema() AS schema,
       (SELECT max(version) FROM awa.schema_migrations) AS migration_version,
       (SELECT applied_at FROM awa.schema_migrations WHERE version = 12) AS entered_at,
       (SELECT max(applied_at) FROM awa.schema_migrations) AS updated_at,
       (SELECT count(*) FROM awa.runtimes WHERE heartbeat_at + stale_after >= now())
           AS live_runtimes,
       to_regclass('awa.active_jobs') IS NOT NULL AND to_regclass('awa.held_jobs') IS NOT NULL
           AND to_regclass('awa.done_jobs') IS NOT NULL AS ready

-- name: storage_drop
-- install_queue_storage(reset=True), as the reference does it: the whole schema goes (every
-- job, schedule and setting), then the migrations build it again in the same transaction.
DROP SCHEMA awa CASCADE
