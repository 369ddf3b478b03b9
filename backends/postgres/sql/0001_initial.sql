-- guarded PostgreSQL backend, schema version 1.
--
-- Applied by guarded.backends.postgres.migrations inside one transaction, under an advisory
-- lock, with search_path set to the store's schema: every name below is unqualified and lands
-- in that schema. Forward-only: never edit this file once released; add 0002_*.sql instead.
--
-- Conventions
--   * JSON is stored in `json` columns (exact text; see json_codec.py for why not `jsonb`).
--   * Text columns hold the NUL-escaped form of strings (json_codec.to_db_text).
--   * `id` identity columns give the insertion order used for ties and cursors.
--   * `created_at` is the server time a row was stored; retention works on it (BRIN indexes:
--     tiny, and ideal for append-only, time-correlated tables).
--   * Columns other than `doc`/`payload` exist for lookups, ordering and ops queries; records are
--     rebuilt from `doc` (the lossless record encoding of guarded.codec).

-- One sequence orders "saved" events across upsert tables (bindings, trajectories, artifacts).
CREATE SEQUENCE guarded_seq AS bigint;

-- Runtime audit log (spec 000 flow_events). Idempotent by (trace_id, event_fp):
-- event_fp = sha256 of the canonical JSON of {trace_id, ts, kind, node_name, node_id, payload}.
CREATE TABLE flow_events (
    id          bigint GENERATED ALWAYS AS IDENTITY,
    trace_id    text NOT NULL,            -- '__global__' for trace_id=None
    ts          double precision NOT NULL,
    kind        text NOT NULL,
    node_name   text,
    node_id     text,
    event_fp    bytea NOT NULL,
    payload     json NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (trace_id, event_fp)
);
CREATE INDEX flow_events_history ON flow_events (trace_id, ts, id);
CREATE INDEX flow_events_created_brin ON flow_events USING brin (created_at);

-- Remote bindings (spec 000 + PenguiFlow 3.11 conversation bindings).
-- context_key is context_id's escaped text, or a lone U+E000 for None (no escaped string equals it).
CREATE TABLE remote_bindings (
    id                 bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    trace_id           text NOT NULL,
    context_key        text NOT NULL,
    task_id            text NOT NULL,
    agent_url          text NOT NULL,
    router_session_id  text,
    remote_skill       text,
    tenant_id          text,
    user_id            text,
    is_terminal        boolean NOT NULL DEFAULT false,
    doc                json NOT NULL,
    saved_seq          bigint NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (trace_id, context_key, task_id)
);
CREATE INDEX remote_bindings_conversation
    ON remote_bindings (router_session_id, agent_url, remote_skill, saved_seq DESC)
    WHERE router_session_id IS NOT NULL;

-- Planner pause state (spec 000 planner_pauses) with consume-once that is safe to retry:
-- a consume with an idempotency key marks the row (consumed_at, consumer_key) instead of
-- deleting it, so a repeat with the same key within the grace period gets the payload again.
CREATE TABLE planner_pauses (
    token         text PRIMARY KEY,
    payload       json NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    consumed_at   timestamptz,
    consumer_key  text
);
CREATE INDEX planner_pauses_expires ON planner_pauses (expires_at);
CREATE INDEX planner_pauses_consumed ON planner_pauses (consumed_at) WHERE consumed_at IS NOT NULL;

-- Short-term memory (spec 000 memory_states).
CREATE TABLE memory_states (
    key         text PRIMARY KEY,
    state       json NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Task state (spec 000 task_states), keyed by task_id: a task saved under another session moves.
-- Last-write-wins on updated_at: an upsert never replaces a row with a newer updated_at.
-- list_seq orders list_tasks by first save in the session.
CREATE TABLE task_states (
    task_id     text PRIMARY KEY,
    session_id  text NOT NULL,
    status      text NOT NULL,
    task_type   text NOT NULL,
    trace_id    text,
    updated_at  timestamptz NOT NULL,
    doc         json NOT NULL,
    list_seq    bigint NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    stored_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX task_states_session ON task_states (session_id, list_seq);
CREATE INDEX task_states_status ON task_states (session_id, status);

-- Task updates (spec 000 state_updates): append-only, idempotent by (session_id, update_id).
CREATE TABLE state_updates (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id   text NOT NULL,
    task_id      text NOT NULL,
    update_id    text NOT NULL,
    update_type  text NOT NULL,
    doc          json NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (session_id, update_id)
);
CREATE INDEX state_updates_cursor ON state_updates (session_id, id);
CREATE INDEX state_updates_task ON state_updates (session_id, task_id, id);
CREATE INDEX state_updates_created_brin ON state_updates USING brin (created_at);

-- Steering events (spec 000 steering_events): sanitized, idempotent by (session_id, event_id).
CREATE TABLE steering_events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id  text NOT NULL,
    task_id     text NOT NULL,
    event_id    text NOT NULL,
    event_type  text NOT NULL,
    doc         json NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (session_id, event_id)
);
CREATE INDEX steering_events_cursor ON steering_events (session_id, id);
CREATE INDEX steering_events_task ON steering_events (session_id, task_id, id);
CREATE INDEX steering_events_created_brin ON steering_events USING brin (created_at);

-- Trajectories (spec 000 trajectories), one per trace: saving a trace under another session moves
-- it there. list_traces orders by saved_seq (most recently saved first).
CREATE TABLE trajectories (
    trace_id    text PRIMARY KEY,
    session_id  text NOT NULL,
    doc         json NOT NULL,
    saved_seq   bigint NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX trajectories_recent ON trajectories (session_id, saved_seq DESC);

-- Planner events (spec 000 planner_events): append-only, emission order by id. Identical events
-- are legitimate (equal stream chunks), so there is no content key; a retry is recognised by the
-- caller's idempotency key instead (call_key = "<key>:<index in the call>", NULL without a key).
CREATE TABLE planner_events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    trace_id    text NOT NULL,
    event_type  text NOT NULL,
    ts          double precision NOT NULL,
    call_key    text,
    doc         json NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX planner_events_trace ON planner_events (trace_id, id);
CREATE UNIQUE INDEX planner_events_call ON planner_events (trace_id, call_key) WHERE call_key IS NOT NULL;
CREATE INDEX planner_events_created_brin ON planner_events USING brin (created_at);

-- Artifacts (spec 000 artifacts) on bytea, with ArtifactRetentionConfig enforced by the store.
-- session_key / trace_key group artifacts for the per-session / per-trace limits (NULL: no scope).
CREATE TABLE artifacts (
    artifact_id  text PRIMARY KEY,
    session_key  text,
    trace_key    text,
    size_bytes   bigint NOT NULL,
    mime_type    text,
    sha256       text NOT NULL,
    ref          json NOT NULL,
    data         bytea NOT NULL,
    inserted_seq bigint NOT NULL,
    used_seq     bigint NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz
);
ALTER TABLE artifacts ALTER COLUMN data SET STORAGE EXTERNAL;
CREATE INDEX artifacts_session ON artifacts (session_key, used_seq);
CREATE INDEX artifacts_trace ON artifacts (trace_key, used_seq);
CREATE INDEX artifacts_expires ON artifacts (expires_at) WHERE expires_at IS NOT NULL;
