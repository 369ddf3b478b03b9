"""encode_call / decode_call of the artifact writes: ``put_bytes`` and ``put_text`` round-trip with
their keyword arguments (bytes as base64, the scope as an ArtifactScope record); bad data is
refused naming the argument, never the value."""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guarded.codec import DEFAULT_TYPES, RecordTypes, penguiflow_types
from guarded.deadletter import CALL_SPECS, decode_call, encode_call
from guarded.errors import InvalidPayloadError
from guarded.models import ArtifactScope

SECRET = "hunter2-secret"
ALL_BYTES = bytes(range(256))


def roundtrip(
    method: str, args: tuple[Any, ...], kwargs: dict[str, Any], types: RecordTypes = DEFAULT_TYPES
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    data = encode_call(method, args, kwargs)
    stored = json.loads(json.dumps(data, allow_nan=False))
    return decode_call(method, stored, types)


def full_kwargs(t: RecordTypes) -> dict[str, Any]:
    return {
        "mime_type": "image/png",
        "filename": "chart \u00e9\u2603.png",
        "namespace": "tool/charts",
        "scope": t.ArtifactScope(tenant_id="t1", user_id="u\x00nul", session_id="s1", trace_id=None),
        "meta": {"tool": "plot", "nested": {"n": [1, 2.5, None, True]}, "": "empty key"},
    }


def test_both_puts_have_specs_with_their_keyword_arguments() -> None:
    for method, first in (("put_bytes", "data"), ("put_text", "text")):
        spec = CALL_SPECS[method]
        assert [param.name for param in spec.params] == [
            first,
            "mime_type",
            "filename",
            "namespace",
            "scope",
            "meta",
        ]
        leading = spec.positional(0)
        assert leading is not None
        assert leading.name == first
        assert spec.positional(1) is None  # the metadata is keyword-only, as in the protocol


@pytest.mark.parametrize("positional", [True, False], ids=["positional-data", "keyword-data"])
def test_put_bytes_round_trips_every_argument(positional: bool) -> None:
    kwargs = full_kwargs(DEFAULT_TYPES)
    args: tuple[Any, ...] = (ALL_BYTES,) if positional else ()
    if not positional:
        kwargs["data"] = ALL_BYTES
    decoded_args, decoded_kwargs = roundtrip("put_bytes", args, kwargs)
    assert decoded_args == args
    assert decoded_kwargs == kwargs
    assert type(decoded_kwargs["scope"]) is ArtifactScope
    assert set(decoded_kwargs) == set(kwargs)  # no argument added or lost


def test_the_bytes_are_base64_in_the_encoded_call() -> None:
    data = encode_call("put_bytes", (b"\x00\xffbinary",), {})
    assert data == {"args": [base64.b64encode(b"\x00\xffbinary").decode("ascii")], "kwargs": {}}
    json.dumps(data, allow_nan=False)  # plain JSON


def test_bytearray_and_memoryview_come_back_as_bytes() -> None:
    for value in (bytearray(b"abc"), memoryview(b"abc")):
        (decoded,), _ = roundtrip("put_bytes", (value,), {})
        assert decoded == b"abc"
        assert type(decoded) is bytes


def test_empty_and_large_contents_round_trip() -> None:
    assert roundtrip("put_bytes", (b"",), {}) == ((b"",), {})
    large = ALL_BYTES * 4096  # 1 MiB
    assert roundtrip("put_bytes", (large,), {"namespace": None}) == ((large,), {"namespace": None})


def test_put_text_round_trips_unicode_and_nul() -> None:
    text = "h\u00e9llo \u2603 \U0001f600 a\x00b"
    kwargs = full_kwargs(DEFAULT_TYPES)
    assert roundtrip("put_text", (text,), kwargs) == ((text,), kwargs)
    assert roundtrip("put_text", (), {"text": text, "mime_type": "text/markdown"}) == (
        (),
        {"text": text, "mime_type": "text/markdown"},
    )


def test_defaults_left_out_stay_left_out() -> None:
    assert roundtrip("put_text", ("x",), {}) == (("x",), {})
    assert roundtrip("put_bytes", (b"x",), {"scope": None, "meta": None}) == (
        (b"x",),
        {"scope": None, "meta": None},
    )


def test_scope_decodes_into_the_families_class() -> None:
    try:
        types = penguiflow_types()
    except ImportError:
        pytest.skip("penguiflow is not installed")
    kwargs = full_kwargs(types)
    _, decoded = roundtrip("put_bytes", (b"x",), kwargs, types)
    assert type(decoded["scope"]) is types.ArtifactScope
    assert decoded == kwargs
    _, ours = roundtrip("put_bytes", (b"x",), kwargs, DEFAULT_TYPES)  # penguiflow's in, ours out
    assert type(ours["scope"]) is ArtifactScope
    assert ours["scope"].user_id == "u\x00nul"


@given(st.binary(max_size=2048), st.one_of(st.none(), st.text(max_size=20)))
def test_any_content_round_trips(data: bytes, namespace: str | None) -> None:
    try:
        kwargs = {"namespace": namespace}
        encoded = encode_call("put_bytes", (data,), kwargs)
    except InvalidPayloadError:
        assert namespace is not None  # only a namespace with a lone surrogate can be refused
        return
    assert decode_call("put_bytes", json.loads(json.dumps(encoded)), DEFAULT_TYPES) == ((data,), kwargs)


class Exploding:
    @property
    def tenant_id(self) -> str:
        raise RuntimeError(SECRET)


BAD_CALLS: list[tuple[str, str, tuple[Any, ...], dict[str, Any], str]] = [
    ("text as bytes", "put_bytes", (SECRET,), {}, "data"),
    ("None as bytes", "put_bytes", (), {"data": None}, "data"),
    ("bytes as text", "put_text", (SECRET.encode(),), {}, "text"),
    ("lone surrogate in text", "put_text", (SECRET + "\ud800",), {}, "text"),
    ("nan in meta", "put_bytes", (b"x",), {"meta": {"score": math.nan}}, "meta[key #0 (str)]"),
    ("meta not a mapping", "put_bytes", (b"x",), {"meta": [SECRET]}, "meta"),
    ("object in meta", "put_text", ("x",), {"meta": {"o": object()}}, "meta[key #0 (str)]"),
    ("mime type not text", "put_bytes", (b"x",), {"mime_type": 3}, "mime_type"),
    ("lone surrogate in filename", "put_text", ("x",), {"filename": SECRET + "\udfff"}, "filename"),
    ("scope not a record", "put_bytes", (b"x",), {"scope": {"session_id": SECRET}}, "scope.tenant_id"),
    ("scope attribute raises", "put_bytes", (b"x",), {"scope": Exploding()}, "scope"),
    ("unknown keyword with bytes", "put_bytes", (b"x",), {"extra": b"raw"}, "extra"),
]


@pytest.mark.parametrize(
    ("label", "method", "args", "kwargs", "path"), BAD_CALLS, ids=[case[0] for case in BAD_CALLS]
)
def test_bad_calls_are_refused_naming_the_path_not_the_value(
    label: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], path: str
) -> None:
    with pytest.raises(InvalidPayloadError) as caught:
        encode_call(method, args, kwargs)
    assert caught.value.method == method
    assert caught.value.path == path
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize(
    "data",
    [
        {"args": ["not base64!"], "kwargs": {}},
        {"args": ["QUJ"], "kwargs": {}},  # bad padding
        {"args": [[1, 2]], "kwargs": {}},
        {"args": [], "kwargs": {"data": 5}},
        {"args": ["QUJD"], "kwargs": {"scope": "session"}},
        {"args": ["QUJD"], "kwargs": {"scope": {"session_id": 7}}},
    ],
)
def test_decoding_a_damaged_call_raises_invalid_payload(data: dict[str, Any]) -> None:
    with pytest.raises(InvalidPayloadError) as caught:
        decode_call("put_bytes", data)
    assert caught.value.method == "put_bytes"


def test_encoded_call_does_not_share_state_with_the_caller() -> None:
    content = bytearray(b"abc")
    meta: dict[str, Any] = {"items": [1]}
    data = encode_call("put_bytes", (content,), {"meta": meta})
    content[0] = ord("z")
    meta["items"].append(2)
    assert decode_call("put_bytes", data) == ((b"abc",), {"meta": {"items": [1]}})
