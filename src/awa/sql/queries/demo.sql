-- `awa demo`: the state of the jobs one demo run inserted (tagged in metadata).

-- name: demo_states
SELECT queue, state::text AS state, count(*) AS jobs
FROM awa.jobs
WHERE metadata->>'demo_run' = %(run)s
GROUP BY queue, state
ORDER BY queue, state
