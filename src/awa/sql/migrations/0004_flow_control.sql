-- Flow control across the fleet: per-queue rate limits and caps, per-key limits.
--
-- A worker running a queue with limits claims through awa.claim_limited, passing the limits
-- it was configured with. The function locks the queue's row of awa.queue_limits first, so
-- claims of that queue are serialized across every worker: the check and the grant cannot
-- interleave, and no two claimers take the last slot. The row holds the shared token bucket
-- and, for operators, the limits of the worker that started last. Queues without limits
-- claim as before (claim_jobs) and pay nothing.

-- A tenant, an account, a provider: at most key_concurrency running jobs per key.
ALTER TABLE awa.jobs ADD COLUMN concurrency_key text;
ALTER TABLE awa.jobs ADD CONSTRAINT jobs_concurrency_key_length
    CHECK (concurrency_key IS NULL OR length(concurrency_key) BETWEEN 1 AND 200);

-- Running jobs per queue and key, for the caps and the per-key limits. It replaces the
-- running index of rescue (keyed by id), which a scan of every running row can use as well:
-- a claim adds one entry to one running index, as before. Heartbeats still leave it alone.
DROP INDEX awa.jobs_running_idx;
CREATE INDEX jobs_running_idx ON awa.jobs (queue, concurrency_key) WHERE state = 'running';

CREATE TABLE awa.queue_limits (
    queue text PRIMARY KEY,
    -- Token bucket: at most rate jobs started per second, burst at once.
    rate double precision CHECK (rate IS NULL OR rate > 0),
    burst integer CHECK (burst IS NULL OR burst >= 1),
    tokens double precision NOT NULL DEFAULT 0,
    tokens_at timestamptz NOT NULL DEFAULT now(),
    -- At most this many jobs of the queue running across the fleet.
    max_running integer CHECK (max_running IS NULL OR max_running >= 1),
    -- At most this many running jobs with the same concurrency_key.
    key_concurrency integer CHECK (key_concurrency IS NULL OR key_concurrency >= 1),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- The jobs a claim under a per-key limit takes (ids, at most p_room): in claim order,
-- skipping the keys at their limit, and no more per key than the key has room for. It scans
-- a window of candidates a few times the room; when one key's long run of jobs fills the
-- window, that key is full after this pass, and the next pass, with a wider window, skips
-- it. So a key with a backlog of thousands does not hide the other keys' jobs.
CREATE FUNCTION awa.pick_keyed(p_queue text, p_room integer, p_key_concurrency integer)
RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    -- Per key: its running jobs, and the jobs picked so far.
    v_taken jsonb;
    v_full text[];
    v_picked bigint[] := '{}';
    v_new bigint[];
    v_new_keys text[];
    v_seen integer;
    v_window integer := p_room * 4;
BEGIN
    SELECT COALESCE(jsonb_object_agg(s.ckey, s.n), '{}'::jsonb) INTO v_taken FROM (
        SELECT j.concurrency_key AS ckey, count(*) AS n FROM awa.jobs AS j
        WHERE j.state = 'running' AND j.queue = p_queue AND j.concurrency_key IS NOT NULL
        GROUP BY j.concurrency_key
    ) AS s;
    FOR v_pass IN 1..4 LOOP
        v_full := ARRAY(
            SELECT t.ckey FROM jsonb_each_text(v_taken) AS t(ckey, n)
            WHERE t.n::integer >= p_key_concurrency
        );
        WITH candidates AS MATERIALIZED (
            SELECT j.id, j.concurrency_key AS ckey, j.priority, j.run_at FROM awa.jobs AS j
            WHERE j.state = 'available' AND j.queue = p_queue AND j.run_at <= now()
              AND NOT (j.id = ANY(v_picked))
              AND (j.concurrency_key IS NULL OR NOT (j.concurrency_key = ANY(v_full)))
            ORDER BY j.priority, j.run_at, j.id
            LIMIT v_window
            FOR UPDATE SKIP LOCKED
        ), chosen AS MATERIALIZED (
            SELECT r.id, r.ckey FROM (
                SELECT c.*, row_number() OVER (
                    PARTITION BY c.ckey ORDER BY c.priority, c.run_at, c.id
                ) AS rank
                FROM candidates AS c
            ) AS r
            WHERE r.ckey IS NULL
               OR r.rank <= p_key_concurrency - COALESCE((v_taken ->> r.ckey)::integer, 0)
            ORDER BY r.priority, r.run_at, r.id
            LIMIT p_room - cardinality(v_picked)
        )
        SELECT (SELECT count(*) FROM candidates),
               COALESCE((SELECT array_agg(ch.id) FROM chosen AS ch), '{}'),
               COALESCE((SELECT array_agg(ch.ckey) FROM chosen AS ch WHERE ch.ckey IS NOT NULL),
                        '{}')
        INTO v_seen, v_new, v_new_keys;
        v_picked := v_picked || v_new;
        SELECT v_taken || COALESCE(jsonb_object_agg(
            k.ckey, COALESCE((v_taken ->> k.ckey)::integer, 0) + k.n
        ), '{}'::jsonb) INTO v_taken
        FROM (SELECT u.ckey, count(*) AS n FROM unnest(v_new_keys) AS u(ckey) GROUP BY u.ckey) AS k;
        EXIT WHEN cardinality(v_picked) >= p_room OR v_seen < v_window;
        v_window := v_window * 4;
    END LOOP;
    RETURN v_picked;
END
$$;

-- The claim of a queue with limits: the queue's limits row is locked first, and only then
-- is the claim run, as a statement of its own, so that it sees every claim committed before
-- the lock was granted (one statement would keep the snapshot it took before waiting).
-- Returns the claimed rows (the columns of claim_jobs) and, in retry_after, how long the
-- caller should wait before asking again when a limit held jobs back (NULL when none did);
-- when no job is claimed but one was held back, a single row of NULLs carries it.
CREATE FUNCTION awa.claim_limited(
    p_queue text, p_limit integer, p_deadline interval, p_rate double precision,
    p_burst integer, p_max_running integer, p_key_concurrency integer
)
RETURNS TABLE (
    id bigint, kind text, queue text, args jsonb, priority smallint, attempt smallint,
    max_attempts smallint, run_lease bigint, run_at double precision,
    created_at double precision, attempted_at double precision, deadline_at double precision,
    errors jsonb, metadata jsonb, tags text[], progress jsonb, deadline_duration interval,
    unique_key bytea, unique_states smallint, ordering_key bytea, callback_id uuid,
    callback_timeout_at double precision, callback_filter text, callback_on_complete text,
    callback_on_fail text, callback_transform text, concurrency_key text,
    retry_after double precision
)
LANGUAGE plpgsql AS $$
DECLARE
    lim awa.queue_limits%ROWTYPE;
    v_room integer := p_limit;
    v_tokens double precision;
    v_running integer;
    v_wait double precision;
    -- When a limit granted no more than asked and the claim used all of it, the limit is
    -- reached and more jobs may wait: how long until it lets one more start.
    v_wait_if_used double precision;
    v_claimed integer;
    v_ids bigint[];
    -- The bucket's clock: the tokens counted now are the tokens taken at this instant.
    v_now timestamptz;
BEGIN
    -- A claim lost in a server crash only leaves the job available (see claim_jobs).
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT * INTO lim FROM awa.queue_limits AS l WHERE l.queue = p_queue FOR UPDATE;
    IF NOT FOUND THEN
        -- A row deleted by a worker started since without limits: bring it back.
        INSERT INTO awa.queue_limits AS l (queue, rate, burst, max_running, key_concurrency,
                                           tokens)
        VALUES (p_queue, p_rate, p_burst, p_max_running, p_key_concurrency,
                COALESCE(p_burst, 0))
        ON CONFLICT ON CONSTRAINT queue_limits_pkey DO NOTHING;
        SELECT * INTO lim FROM awa.queue_limits AS l WHERE l.queue = p_queue FOR UPDATE;
    END IF;
    IF EXISTS (SELECT 1 FROM awa.queues AS q WHERE q.queue = p_queue AND q.paused) THEN
        RETURN;
    END IF;
    IF p_rate IS NOT NULL THEN
        v_now := clock_timestamp();
        v_tokens := least(
            p_burst,
            lim.tokens + extract(epoch FROM v_now - lim.tokens_at) * p_rate
        );
        IF floor(v_tokens) <= v_room THEN
            v_room := floor(v_tokens)::integer;
            v_wait_if_used := 0;  -- the refill time, once the claim took its tokens
        END IF;
        IF v_room < 1 THEN
            v_wait := (1 - v_tokens) / p_rate;
        END IF;
    END IF;
    IF p_max_running IS NOT NULL AND v_room > 0 THEN
        SELECT count(*) INTO v_running FROM awa.jobs AS j
        WHERE j.state = 'running' AND j.queue = p_queue;
        IF v_running >= p_max_running THEN
            v_room := 0;
            v_wait := 0.05;
        ELSIF p_max_running - v_running <= v_room THEN
            v_room := p_max_running - v_running;
            v_wait_if_used := 0.05;
        END IF;
    END IF;
    IF v_room > 0 THEN
        IF p_key_concurrency IS NULL THEN
            SELECT array_agg(c.id) INTO v_ids FROM (
                SELECT j.id FROM awa.jobs AS j
                WHERE j.state = 'available' AND j.queue = p_queue AND j.run_at <= now()
                ORDER BY j.priority, j.run_at, j.id
                LIMIT v_room
                FOR UPDATE SKIP LOCKED
            ) AS c;
        ELSE
            v_ids := awa.pick_keyed(p_queue, v_room, p_key_concurrency);
        END IF;
        RETURN QUERY
        UPDATE awa.jobs AS j
        SET state = 'running',
            attempt = j.attempt + 1,
            run_lease = j.run_lease + 1,
            attempted_at = now(),
            heartbeat_at = now(),
            deadline_at = CASE
                WHEN COALESCE(j.deadline_duration, p_deadline) > interval '0'
                THEN now() + COALESCE(j.deadline_duration, p_deadline)
            END
        WHERE j.id = ANY(v_ids) AND j.state = 'available'
        RETURNING j.id, j.kind, j.queue, j.args, j.priority, j.attempt, j.max_attempts,
                  j.run_lease,
                  extract(epoch FROM j.run_at)::float8,
                  extract(epoch FROM j.created_at)::float8,
                  extract(epoch FROM j.attempted_at)::float8,
                  extract(epoch FROM j.deadline_at)::float8,
                  NULLIF(j.errors, '[]'::jsonb), NULLIF(j.metadata, '{}'::jsonb), j.tags,
                  j.progress, j.deadline_duration, j.unique_key, j.unique_states,
                  j.ordering_key, j.callback_id,
                  extract(epoch FROM j.callback_timeout_at)::float8, j.callback_filter,
                  j.callback_on_complete, j.callback_on_fail, j.callback_transform,
                  j.concurrency_key, NULL::float8;
        GET DIAGNOSTICS v_claimed = ROW_COUNT;
        IF v_claimed = v_room AND v_wait_if_used IS NOT NULL THEN
            v_wait := CASE
                WHEN v_wait_if_used = 0 THEN greatest(1 - (v_tokens - v_claimed), 0) / p_rate
                ELSE v_wait_if_used
            END;
        ELSIF v_claimed < v_room AND p_key_concurrency IS NOT NULL AND EXISTS (
            SELECT 1 FROM awa.jobs AS j
            WHERE j.state = 'available' AND j.queue = p_queue AND j.run_at <= now()
        ) THEN
            -- Jobs wait whose keys are at their limit: ask again soon.
            v_wait := 0.05;
        END IF;
    ELSE
        v_claimed := 0;
    END IF;
    IF p_rate IS NOT NULL THEN
        UPDATE awa.queue_limits AS l
        SET tokens = v_tokens - v_claimed, tokens_at = v_now
        WHERE l.queue = p_queue;
    END IF;
    IF v_wait IS NOT NULL THEN
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::jsonb,
            NULL::smallint, NULL::smallint, NULL::smallint, NULL::bigint, NULL::float8,
            NULL::float8, NULL::float8, NULL::float8, NULL::jsonb, NULL::jsonb, NULL::text[],
            NULL::jsonb, NULL::interval, NULL::bytea, NULL::smallint, NULL::bytea, NULL::uuid,
            NULL::float8, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text,
            v_wait;
    END IF;
END
$$;
