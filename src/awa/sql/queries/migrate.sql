-- Applying migrations. The whole run happens in one transaction that first takes an
-- advisory lock, so concurrent migrators queue behind each other and the later ones find
-- nothing left to do.

-- name: migrate_lock
-- Key: the ASCII bytes of "AWAMIGRT".
SELECT pg_advisory_xact_lock(4706293308302496340)

-- name: migrate_bootstrap
-- Created only when missing: CREATE ... IF NOT EXISTS checks the CREATE privilege even when
-- the object exists, and a role without it (a worker's) may run a migrate with nothing to do.
DO $$
BEGIN
    IF to_regnamespace('awa') IS NULL THEN
        CREATE SCHEMA awa;
    END IF;
    IF to_regclass('awa.schema_migrations') IS NULL THEN
        CREATE TABLE awa.schema_migrations (
            version integer PRIMARY KEY,
            name text NOT NULL,
            applied_at timestamptz NOT NULL DEFAULT now()
        );
    END IF;
END
$$

-- name: migrate_applied_versions
SELECT version FROM awa.schema_migrations ORDER BY version

-- name: migrate_record
INSERT INTO awa.schema_migrations (version, name) VALUES (%(version)s, %(name)s)

-- name: schema_migrations_exists
SELECT to_regclass('awa.schema_migrations') IS NOT NULL AS present

-- name: schema_version
-- The newest applied migration (run only once schema_migrations_exists said yes).
SELECT max(version) AS version FROM awa.schema_migrations
