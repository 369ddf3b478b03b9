"""Lossless JSON codec for every StateStore record, payload and trajectory.

``encode(record)`` turns any record of the protocol, ours or PenguiFlow's, into a plain JSON
object; ``decode(name, data)`` rebuilds it. Values JSON cannot carry are refused with
:class:`~guarded.errors.InvalidPayloadError` naming the path of the offending value by position,
never by content (``payload[key #0 (str)][3]``).
"""

from .arguments import float_argument, item_arguments, optional_text_argument, refusing, text_argument
from .event_identity import event_fingerprint, event_fingerprint_and_text
from .json_text import ORJSON_AGREES, canonical_json, compact_json, fixed_float, orjson_ready, parse_json
from .json_values import JSONObject, JSONValue, check_text, key_path, to_json_object, to_json_value
from .records import (
    ARTIFACT_REF,
    ARTIFACT_RETENTION_CONFIG,
    ARTIFACT_SCOPE,
    CODECS,
    DEFAULT_TYPES,
    PLANNER_EVENT,
    REMOTE_BINDING,
    STATE_UPDATE,
    STEERING_EVENT,
    STORED_EVENT,
    TASK_CONTEXT_SNAPSHOT,
    TASK_STATE,
    TASK_TELEMETRY_EVENT,
    RecordCodec,
    RecordTypes,
    codec_for,
    decode,
    encode,
    installed_types,
    penguiflow_types,
    record_types_of,
)
from .trajectories import decode_trajectory, encode_trajectory, register_trajectory_type

__all__ = [
    "ARTIFACT_REF",
    "ARTIFACT_RETENTION_CONFIG",
    "ARTIFACT_SCOPE",
    "CODECS",
    "DEFAULT_TYPES",
    "ORJSON_AGREES",
    "PLANNER_EVENT",
    "REMOTE_BINDING",
    "STATE_UPDATE",
    "STEERING_EVENT",
    "STORED_EVENT",
    "TASK_CONTEXT_SNAPSHOT",
    "TASK_STATE",
    "TASK_TELEMETRY_EVENT",
    "JSONObject",
    "JSONValue",
    "RecordCodec",
    "RecordTypes",
    "check_text",
    "canonical_json",
    "codec_for",
    "compact_json",
    "decode",
    "decode_trajectory",
    "encode",
    "encode_trajectory",
    "event_fingerprint",
    "event_fingerprint_and_text",
    "fixed_float",
    "float_argument",
    "installed_types",
    "item_arguments",
    "key_path",
    "optional_text_argument",
    "orjson_ready",
    "parse_json",
    "penguiflow_types",
    "record_types_of",
    "refusing",
    "register_trajectory_type",
    "text_argument",
    "to_json_object",
    "to_json_value",
]
