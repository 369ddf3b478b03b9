"""Contracts of the artifact store reached through a state store's ``artifact_store`` property."""

from __future__ import annotations

import hashlib
import sys
from typing import Any

from ..models import ArtifactScope
from ._base import contract, show, survive, unique, violation

ARTIFACTS = "spec 000 'Artifact Store'"


def artifacts(store: Any) -> Any:
    return store.artifact_store


def scope_of(store: Any, **fields: str) -> Any:
    """An ``ArtifactScope`` of the class the artifact store's own module uses: PenguiFlow's or ours.

    PenguiFlow's pydantic ``ArtifactRef`` refuses another class's scope, so the contract speaks the
    store's dialect.
    """
    module = sys.modules.get(type(artifacts(store)).__module__)
    return getattr(module, "ArtifactScope", ArtifactScope)(**fields)


def check_ref(ref: Any, data: bytes, what: str, **expected: Any) -> None:
    """Best-effort fields of a ref (spec: size, hash, mime type) may be None but never wrong."""
    rule = f"ArtifactRef fields are best-effort but never wrong ({ARTIFACTS}, 'ArtifactRef')"
    if ref.size_bytes is not None and ref.size_bytes != len(data):
        raise violation(f"{what}: size_bytes is {ref.size_bytes}, the content has {len(data)} bytes; {rule}")
    if ref.sha256 is not None and ref.sha256 != hashlib.sha256(data).hexdigest():
        raise violation(f"{what}: sha256 is {ref.sha256!r}, not the SHA-256 of the content; {rule}")
    for name, value in expected.items():
        got = getattr(ref, name)
        if got is not None and got != value:
            raise violation(f"{what}: {name} is {show(got)}, expected {show(value)}; {rule}")


@contract(
    "artifacts.bytes_roundtrip",
    "artifacts",
    "put_bytes returns a ref; get returns the exact bytes and get_ref the same ref with its scope.",
)
async def bytes_roundtrip(store: Any) -> None:
    session = unique("session")
    data = f"artifact {session} ".encode() + bytes(range(256))
    scope = scope_of(
        store, tenant_id="tenant-a", user_id="user-a", session_id=session, trace_id=f"{session}-trace"
    )
    ref = await artifacts(store).put_bytes(
        data, mime_type="application/octet-stream", filename="blob.bin", namespace="contract", scope=scope
    )
    check_ref(ref, data, "put_bytes", mime_type="application/octet-stream", filename="blob.bin")
    got = await artifacts(store).get(ref.id)
    if got != data:
        raise violation(f"get({ref.id!r}) returned {show(got)}, not the {len(data)} bytes put ({ARTIFACTS})")
    stored = await artifacts(store).get_ref(ref.id)
    if stored is None or stored.id != ref.id:
        raise violation(f"get_ref({ref.id!r}) returned {show(stored)} for a stored artifact ({ARTIFACTS})")
    check_ref(stored, data, "get_ref", mime_type="application/octet-stream", filename="blob.bin")
    got_scope = stored.scope
    for name in ("tenant_id", "user_id", "session_id", "trace_id"):
        if getattr(got_scope, name, None) != getattr(scope, name):
            raise violation(
                f"get_ref returned scope {show(got_scope)}, expected {show(scope)}; the store keeps the "
                f"scope so the HTTP layer can enforce it ({ARTIFACTS}, 'ArtifactScope')"
            )


@contract(
    "artifacts.text_roundtrip",
    "artifacts",
    "put_text stores UTF-8 text; get returns its bytes and the mime type defaults to text/plain.",
)
async def text_roundtrip(store: Any) -> None:
    text = f"Grüße, 世界 🐧 {unique('text')}\n"
    ref = await artifacts(store).put_text(text, scope=scope_of(store, session_id=unique("session")))
    data = text.encode("utf-8")
    check_ref(ref, data, "put_text", mime_type="text/plain")
    got = await artifacts(store).get(ref.id)
    if got != data:
        raise violation(
            f"get of a put_text artifact returned {show(got)}, expected the text's UTF-8 bytes ({ARTIFACTS})"
        )


@contract(
    "artifacts.exists_delete",
    "artifacts",
    "exists is True until delete (which returns True once); afterwards get and get_ref return None.",
)
async def exists_delete(store: Any) -> None:
    ref = await artifacts(store).put_bytes(
        unique("bytes").encode(), scope=scope_of(store, session_id=unique("session"))
    )
    if await artifacts(store).exists(ref.id) is not True:
        raise violation(f"exists({ref.id!r}) is not True right after put_bytes ({ARTIFACTS})")
    if await artifacts(store).delete(ref.id) is not True:
        raise violation(f"delete({ref.id!r}) of a stored artifact did not return True ({ARTIFACTS})")
    after = {
        "exists": await artifacts(store).exists(ref.id),
        "get": await artifacts(store).get(ref.id),
        "get_ref": await artifacts(store).get_ref(ref.id),
        "delete": await artifacts(store).delete(ref.id),
    }
    if after != {"exists": False, "get": None, "get_ref": None, "delete": False}:
        raise violation(
            f"after delete, the artifact still answers {show(after)}; expected exists False, get/get_ref "
            f"None and a second delete False ({ARTIFACTS})"
        )


@contract(
    "artifacts.unknown_id",
    "artifacts",
    "An unknown id gives get None, get_ref None, exists False, delete False, never an exception.",
)
async def unknown_id(store: Any) -> None:
    missing = unique("missing-artifact")
    rule = f"an unknown artifact id is 'not found', not an error ({ARTIFACTS})"
    answers = {
        "get": await survive("get of an unknown id", artifacts(store).get(missing), rule),
        "get_ref": await survive("get_ref of an unknown id", artifacts(store).get_ref(missing), rule),
        "exists": await survive("exists of an unknown id", artifacts(store).exists(missing), rule),
        "delete": await survive("delete of an unknown id", artifacts(store).delete(missing), rule),
    }
    if answers != {"get": None, "get_ref": None, "exists": False, "delete": False}:
        raise violation(f"an unknown id answered {show(answers)}; {rule}")


@contract(
    "artifacts.list_scope",
    "artifacts",
    "list(scope=...) returns the artifacts matching the scope and none of another session's.",
    requires=("artifact_store.list",),
)
async def list_scope(store: Any) -> None:
    session, other = unique("session"), unique("session")
    mine = await artifacts(store).put_bytes(
        unique("mine").encode(), scope=scope_of(store, tenant_id="t", session_id=session)
    )
    theirs = await artifacts(store).put_bytes(
        unique("theirs").encode(), scope=scope_of(store, tenant_id="t", session_id=other)
    )
    listed = [ref.id for ref in await artifacts(store).list(scope=scope_of(store, session_id=session))]
    rule = f"list filters by scope; None fields of the filter are wildcards ({ARTIFACTS}, 'ArtifactScope')"
    if mine.id not in listed or theirs.id in listed:
        raise violation(
            f"list(scope=session {session!r}) returned {show(listed)}; expected to contain {mine.id!r} "
            f"and not {theirs.id!r}; {rule}"
        )
    listed = [
        ref.id
        for ref in await artifacts(store).list(scope=scope_of(store, session_id=session, tenant_id="other"))
    ]
    if mine.id in listed:
        raise violation(f"list(scope=tenant 'other') returned an artifact of tenant 't'; {rule}")
    empty = await artifacts(store).list(scope=scope_of(store, session_id=unique("session")))
    if list(empty):
        raise violation(f"list(scope=an unknown session) returned {show(empty)}; expected []; {rule}")
