-- Live queue overrides: settings an operator changes for a running fleet, per queue, without
-- a restart. A worker applies a queue's stored settings over the ones it was started with
-- (it reads this table when notified on awa_overrides, and every few seconds anyway), and
-- goes back to its own when they are cleared. One small row per overridden queue, written at
-- operator frequency: nothing on the hot path reads or writes it.
--
-- settings holds only the overridden settings, by name (see awa.overrides.operations):
-- rate_limit [rate, burst], global_max_running, key_concurrency, claim_batch_size,
-- poll_interval (seconds), deadline_duration (seconds, 0: none). Pausing is not stored here:
-- an override's "paused" pauses or resumes the queue in awa.queues, which every claim checks.
CREATE TABLE awa.queue_overrides (
    queue text PRIMARY KEY,
    settings jsonb NOT NULL CHECK (jsonb_typeof(settings) = 'object'),
    updated_at timestamptz NOT NULL DEFAULT now(),
    updated_by text
);

-- Every change: who, when, and the settings before and after ("paused" included).
CREATE TABLE awa.queue_override_log (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL,
    changed_at timestamptz NOT NULL DEFAULT now(),
    changed_by text,
    action text NOT NULL CHECK (action IN ('set', 'clear')),
    old jsonb NOT NULL,
    new jsonb NOT NULL
);
CREATE INDEX queue_override_log_queue_idx ON awa.queue_override_log (queue, id);

-- One change of a queue's overrides, in one statement on any connection: the settings in
-- p_clear are removed, then those of p_set written over the rest; "paused" in either pauses
-- or resumes the queue. Changes of one queue are serialized (also while it has no row), so
-- that each log entry's old value is what the change replaced. A change that changes
-- nothing is not logged. Workers are notified on awa_overrides with the queue's name.
CREATE FUNCTION awa.change_queue_overrides(
    p_queue text, p_set jsonb, p_clear text[], p_by text, p_action text
) RETURNS TABLE (settings jsonb, paused boolean, updated_at timestamptz, updated_by text)
LANGUAGE plpgsql AS $$
DECLARE
    v_old jsonb;
    v_new jsonb;
    v_was_paused boolean;
    v_paused boolean;
    v_at timestamptz;
    v_by text;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('awa.queue_overrides ' || p_queue, 0));
    SELECT o.settings, o.updated_at, o.updated_by INTO v_old, v_at, v_by
    FROM awa.queue_overrides AS o WHERE o.queue = p_queue;
    v_old := COALESCE(v_old, '{}'::jsonb);
    SELECT q.paused INTO v_was_paused FROM awa.queues AS q WHERE q.queue = p_queue;
    v_was_paused := COALESCE(v_was_paused, false);
    v_new := (v_old - COALESCE(p_clear, '{}'::text[])) || (COALESCE(p_set, '{}'::jsonb) - 'paused');
    v_paused := CASE
        WHEN p_set ? 'paused' THEN (p_set ->> 'paused')::boolean
        WHEN 'paused' = ANY(p_clear) THEN false
        ELSE v_was_paused
    END;
    IF v_new IS DISTINCT FROM v_old OR v_paused IS DISTINCT FROM v_was_paused THEN
        IF v_new = '{}'::jsonb THEN
            DELETE FROM awa.queue_overrides AS o WHERE o.queue = p_queue;
            v_at := NULL;
            v_by := NULL;
        ELSE
            v_at := now();
            v_by := p_by;
            INSERT INTO awa.queue_overrides AS o (queue, settings, updated_at, updated_by)
            VALUES (p_queue, v_new, v_at, v_by)
            ON CONFLICT (queue) DO UPDATE
            SET settings = EXCLUDED.settings, updated_at = EXCLUDED.updated_at,
                updated_by = EXCLUDED.updated_by;
        END IF;
        IF v_paused AND NOT v_was_paused THEN
            INSERT INTO awa.queues AS q (queue, paused, paused_at, paused_by)
            VALUES (p_queue, true, now(), p_by)
            ON CONFLICT (queue) DO UPDATE
            SET paused = true, paused_at = now(), paused_by = EXCLUDED.paused_by;
        ELSIF v_was_paused AND NOT v_paused THEN
            UPDATE awa.queues AS q SET paused = false, paused_at = NULL, paused_by = NULL
            WHERE q.queue = p_queue;
            PERFORM pg_notify('awa_jobs', p_queue);
        END IF;
        INSERT INTO awa.queue_override_log (queue, changed_by, action, old, new)
        VALUES (p_queue, p_by, p_action,
                v_old || jsonb_build_object('paused', v_was_paused),
                v_new || jsonb_build_object('paused', v_paused));
        PERFORM pg_notify('awa_overrides', p_queue);
    END IF;
    RETURN QUERY SELECT v_new, v_paused, v_at, v_by;
END;
$$;
