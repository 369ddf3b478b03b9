-- list_traces as PenguiFlow's reference store answers it: a trace is listed by every session it
-- was saved under, most recently saved there first, while get_trajectory answers only for the
-- session of its last save (the trajectories row). Spec 000's schema keys trajectories by
-- (trace_id, session_id), so a session keeps listing a trace saved later under another one.
CREATE TABLE session_traces (
    session_id  text NOT NULL,
    trace_id    text NOT NULL,
    saved_seq   bigint NOT NULL,
    PRIMARY KEY (session_id, trace_id)
);
CREATE INDEX session_traces_recent ON session_traces (session_id, saved_seq DESC);
INSERT INTO session_traces (session_id, trace_id, saved_seq)
    SELECT session_id, trace_id, saved_seq FROM trajectories;
