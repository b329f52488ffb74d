-- Applying migrations. The whole run happens in one transaction that first takes an
-- advisory lock, so concurrent migrators queue behind each other and the later ones find
-- nothing left to do.

-- name: migrate_lock
-- Key: the ASCII bytes of "AWAMIGRT".
SELECT pg_advisory_xact_lock(4706293308302496340)

-- name: migrate_bootstrap
CREATE SCHEMA IF NOT EXISTS awa;
CREATE TABLE IF NOT EXISTS awa.schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migrate_applied_versions
SELECT version FROM awa.schema_migrations ORDER BY version

-- name: migrate_record
INSERT INTO awa.schema_migrations (version, name) VALUES (%(version)s, %(name)s)

-- name: schema_migrations_exists
SELECT to_regclass('awa.schema_migrations') IS NOT NULL AS present

-- name: schema_version
-- The newest applied migration (run only once schema_migrations_exists said yes).
SELECT max(version) AS version FROM awa.schema_migrations
