-- Descriptors: operator-facing metadata of queues and job kinds (a display name, a
-- description, an owner, a documentation link, tags, extra JSON), declared in code with
-- client.queue_descriptor() / client.job_kind_descriptor() and stored when a worker starts.
--
-- Every queue a worker runs and every kind it registers gets a row, blank when nothing was
-- declared for it. descriptor_hash is NULL on a blank row: a worker that declares nothing
-- never erases the descriptor another deployment declared. last_seen_at is refreshed at
-- each start and, while a live worker runs the queue, by the maintenance leader, which
-- deletes the rows nothing has seen for descriptor_retention. The claim, the completion and
-- every other path of a job never read these tables.

CREATE TABLE awa.queue_descriptors (
    queue text PRIMARY KEY,
    display_name text,
    description text,
    owner text,
    docs_url text,
    tags text[] NOT NULL DEFAULT '{}',
    extra jsonb NOT NULL DEFAULT '{}',
    descriptor_hash text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT queue_descriptors_queue_length CHECK (length(queue) BETWEEN 1 AND 200),
    CONSTRAINT queue_descriptors_display_name_length
        CHECK (display_name IS NULL OR length(display_name) <= 200),
    CONSTRAINT queue_descriptors_description_length
        CHECK (description IS NULL OR length(description) <= 2000),
    CONSTRAINT queue_descriptors_owner_length CHECK (owner IS NULL OR length(owner) <= 200),
    CONSTRAINT queue_descriptors_docs_url_length
        CHECK (docs_url IS NULL OR length(docs_url) <= 2048),
    CONSTRAINT queue_descriptors_tags_count CHECK (cardinality(tags) <= 20),
    CONSTRAINT queue_descriptors_extra_object CHECK (jsonb_typeof(extra) = 'object')
);

CREATE TABLE awa.job_kind_descriptors (
    kind text PRIMARY KEY,
    -- The queue the kind's task is registered on (NULL: described, but no task registered
    -- by the worker that stored it). While a live worker runs that queue the row stays fresh.
    queue text,
    display_name text,
    description text,
    owner text,
    docs_url text,
    tags text[] NOT NULL DEFAULT '{}',
    extra jsonb NOT NULL DEFAULT '{}',
    descriptor_hash text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT job_kind_descriptors_kind_length CHECK (length(kind) BETWEEN 1 AND 200),
    CONSTRAINT job_kind_descriptors_display_name_length
        CHECK (display_name IS NULL OR length(display_name) <= 200),
    CONSTRAINT job_kind_descriptors_description_length
        CHECK (description IS NULL OR length(description) <= 2000),
    CONSTRAINT job_kind_descriptors_owner_length CHECK (owner IS NULL OR length(owner) <= 200),
    CONSTRAINT job_kind_descriptors_docs_url_length
        CHECK (docs_url IS NULL OR length(docs_url) <= 2048),
    CONSTRAINT job_kind_descriptors_tags_count CHECK (cardinality(tags) <= 20),
    CONSTRAINT job_kind_descriptors_extra_object CHECK (jsonb_typeof(extra) = 'object')
);
