-- Functions on the insert and claim paths, rewritten so that no statement pays for a SQL
-- function the planner cannot inline. Such a function (LANGUAGE sql whose body is not a
-- single immutable expression, or reads a table) is parsed and planned again in every
-- statement that calls it; one-by-one inserts paid that three times (the slot default, and
-- the notification's payload and position), which made a single-row insert about 40 % dearer
-- than the same insert without them (measured with a server-side loop of one-row
-- transactions). Results are unchanged.

-- Immutable operators only (timestamptz - timestamptz, extract from an interval), so the
-- planner inlines it; the same microseconds as extract(epoch FROM t), which is only stable.
CREATE OR REPLACE FUNCTION awa.position_us(t timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (extract(epoch FROM t - '1970-01-01 00:00:00+00'::timestamptz) * 1000000)::bigint
$$;

-- timestamp + interval and AT TIME ZONE 'UTC' are immutable (timestamptz + interval is not).
CREATE OR REPLACE FUNCTION awa.position_at(us bigint) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN us IS NULL THEN '-infinity'::timestamptz
                ELSE (timestamp '1970-01-01 00:00:00' + us * interval '1 microsecond')
                     AT TIME ZONE 'UTC' END
$$;

-- Concatenation instead of format() (stable), so this inlines too.
CREATE OR REPLACE FUNCTION awa.ready_payload(p_priority smallint, p_run_at timestamptz,
                                             p_id bigint, p_queue text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_priority::text || ' ' || awa.position_us(p_run_at)::text || ' ' || p_id::text
           || ' ' || p_queue
$$;

-- The slots are the inserts' column defaults: PL/pgSQL keeps the read's plan for the
-- session, where a SQL function reading the sequence is planned in every insert.
DO $$
DECLARE
    ring text;
BEGIN
    FOREACH ring IN ARRAY ARRAY['active', 'done'] LOOP
        EXECUTE format(
            'CREATE OR REPLACE FUNCTION awa.%1$s_slot() RETURNS smallint'
            ' LANGUAGE plpgsql STABLE PARALLEL SAFE'
            ' AS $body$ BEGIN RETURN (SELECT last_value::smallint FROM awa.%1$s_slot); END $body$',
            ring);
    END LOOP;
END
$$;
