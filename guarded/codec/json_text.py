"""JSON text of values already checked (by :mod:`.json_values` or a store's own walk), written fast:
compact, ``ensure_ascii=False``, ``allow_nan=False``, byte for byte what ``json.dumps`` writes with
those options, by CPython's C encoder built once (``json.dumps`` builds an encoder on every call
made with options)."""

from __future__ import annotations

import json
from collections.abc import Callable
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any


def _refuse(value: Any) -> Any:
    raise TypeError(f"a {type(value).__name__} is not JSON-serialisable")


def _make_encoder(*, sort_keys: bool) -> Callable[[Any], str]:
    """A compact, ``ensure_ascii=False``, ``allow_nan=False`` JSON encoder.

    No circular-reference check: values reaching it were walked by a check that fails on a cycle
    with ``RecursionError``, or rebuilt by the strict codec (bounded depth).
    """
    if c_make_encoder is not None:
        chunks = c_make_encoder(None, _refuse, encode_basestring, None, ":", ",", sort_keys, False, False)
        return lambda value: "".join(chunks(value, 0))
    encoder = json.JSONEncoder(  # pragma: no cover - interpreters without the C accelerator
        ensure_ascii=False, allow_nan=False, separators=(",", ":"), sort_keys=sort_keys, check_circular=False
    )
    return encoder.encode  # pragma: no cover


compact_json = _make_encoder(sort_keys=False)
"""The JSON text of a checked value, its keys in their order (``ValueError`` for NaN or an
infinity, ``TypeError`` for what JSON cannot carry)."""
canonical_json = _make_encoder(sort_keys=True)
""":data:`compact_json` with the keys of every object sorted: one text per value (an identity)."""

__all__ = ["canonical_json", "compact_json"]
