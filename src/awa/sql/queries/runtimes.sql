-- Worker runtimes (awa.runtimes): registration, heartbeat, removal and expiry.

-- name: runtime_upsert
-- At start and on every heartbeat: the whole row, so that a runtime whose row was expired
-- during a long outage comes back as soon as it can reach the database again.
INSERT INTO awa.runtimes AS r
    (id, hostname, pid, application_name, version, queues, kinds, concurrency, is_leader,
     stale_after)
VALUES (%(id)s, %(hostname)s, %(pid)s, %(application_name)s, %(version)s, %(queues)s,
        %(kinds)s, %(concurrency)s, %(is_leader)s, make_interval(secs => %(stale_after)s))
ON CONFLICT (id) DO UPDATE
SET heartbeat_at = now(), is_leader = EXCLUDED.is_leader

-- name: runtime_delete
DELETE FROM awa.runtimes WHERE id = %(id)s

-- name: runtimes_expire
-- Rows of processes that stopped heartbeating (crashed, killed, cut off).
DELETE FROM awa.runtimes WHERE heartbeat_at + stale_after < now()

-- name: runtimes_live
SELECT id, hostname, pid, application_name, version, queues, kinds, concurrency, is_leader,
       started_at, heartbeat_at
FROM awa.runtimes
WHERE heartbeat_at + stale_after >= now()
ORDER BY started_at, id

-- name: unserved_kinds
-- Kinds waiting more than `after` seconds for a worker of their queue that runs them
-- (awa.unserved_kinds, migration 14).
SELECT queue, kind, available,
       EXTRACT(EPOCH FROM now() - oldest_run_at)::float8 AS oldest_available_age
FROM awa.unserved_kinds(make_interval(secs => %(after)s))
ORDER BY queue, kind
