-- Completion in the handler's own transaction (job.finalize(), job.complete_in()): when the
-- guarded completion finds the attempt no longer running under its lease (rescued,
-- cancelled, re-claimed or completed already), the worker calls this function, which
-- raises. An error, not an empty result, so that the caller's transaction is aborted by the
-- server and its business writes cannot commit without the completion they depend on,
-- whatever the driver or the code around it does with the result.
CREATE FUNCTION awa.attempt_lost(job_id bigint, lease bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'awa: job % is no longer running the attempt with run_lease % (rescued, cancelled, re-claimed or completed already); its completion and this transaction''s writes cannot commit', job_id, lease
        USING ERRCODE = 'AWA01';
END
$$;
