-- awa.testing's helpers, for test databases only.

-- name: testing_clean
-- Every job (in each of its homes) and every queue setting.
DELETE FROM awa.active_jobs;
DELETE FROM awa.held_jobs;
DELETE FROM awa.done_jobs;
DELETE FROM awa.unique_keys;
DELETE FROM awa.queues
