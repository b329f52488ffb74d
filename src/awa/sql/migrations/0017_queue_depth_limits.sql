-- Backpressure: a depth limit per queue and what an insert does when the queue is over it
-- ('signal': the insert succeeds and the client reports the queue over its limit; 'reject':
-- the insert raises QueueOverLimit). Inserts never count the job table: a client reads these
-- rows with the leader's last sample (awa.queue_samples) and caches them for a second.
CREATE TABLE awa.queue_depth_limits (
    queue text PRIMARY KEY,
    max_depth bigint NOT NULL CHECK (max_depth > 0),
    policy text NOT NULL CHECK (policy IN ('signal', 'reject')),
    updated_at timestamptz NOT NULL DEFAULT now()
);
