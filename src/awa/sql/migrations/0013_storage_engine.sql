-- The reference package's question "where is the active queue storage?", answered for awa's
-- one storage engine (migration 12): its tables (awa.active_jobs, awa.held_jobs,
-- awa.done_jobs, read and written through the awa.jobs view) live in the schema awa. Tools
-- written for the reference call this function to find them; there is no other engine to
-- switch to, so the answer never changes.

CREATE FUNCTION awa.active_queue_storage_schema() RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT n.nspname::text
    FROM pg_catalog.pg_class AS c
    JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
    WHERE c.oid = 'awa.active_jobs'::regclass
$$;

COMMENT ON FUNCTION awa.active_queue_storage_schema() IS
    'The schema holding awa''s job storage (awa.active_jobs, awa.held_jobs, awa.done_jobs): awa.';
