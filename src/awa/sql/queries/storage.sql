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
