-- Last-write-wins by logical time (guarded.logical_time): each last-write-wins row keeps the
-- logical time (microseconds since the Unix epoch) of the write that set it, and an older write
-- leaves it alone. Rows written before this migration have time 0: any write replaces them.
-- Adding a column with a constant default rewrites no table (PostgreSQL 11+).
ALTER TABLE memory_states ADD COLUMN logical_time bigint NOT NULL DEFAULT 0;
ALTER TABLE trajectories ADD COLUMN logical_time bigint NOT NULL DEFAULT 0;
ALTER TABLE remote_bindings ADD COLUMN logical_time bigint NOT NULL DEFAULT 0;
ALTER TABLE planner_pauses ADD COLUMN logical_time bigint NOT NULL DEFAULT 0;
