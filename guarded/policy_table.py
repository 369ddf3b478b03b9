"""The policy table: :class:`PolicyTable` gives the :class:`~guarded.policy.MethodPolicy` of a method
by name -- the built-in entry (:mod:`guarded.builtin_policies`), a legacy alias's target's, a
user's override, or one inferred from the name (:func:`infer_policy`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from .builtin_policies import ALIASES, artifact_store_policies, snapshot_store_policies, state_store_policies
from .policy import Fallback, Kind, LocalFallback, Merge, MethodPolicy

_WRITE_PREFIXES = ("save_", "put_", "set_", "mark_", "delete_", "upsert_", "append_", "add_", "update_")
_READ_PREFIXES = ("load_", "get_", "list_", "find_", "exists", "fetch_", "read_", "count_", "has_")


def infer_policy(name: str) -> MethodPolicy:
    """Policy for a method the table does not know, from its name.

    ``save_/put_/set_/mark_/delete_...`` are writes (upserts: repeat-safe, no dead-letter without an
    explicit entry); ``load_/get_/list_/find_/exists...`` reads (``list_`` falls back to ``[]``,
    ``exists`` to ``False``). Anything else is treated as a non-repeatable write: never retried
    blindly, and its fallback is ``None``.
    """
    if name.startswith(("delete_", "remove_")):
        return MethodPolicy(name, Kind.DELETE, inferred=True)
    if name.startswith(_WRITE_PREFIXES):
        return MethodPolicy(name, Kind.UPSERT, inferred=True)
    if name.startswith(("list_", "find_all", "fetch_all")):
        return MethodPolicy(name, Kind.READ, Fallback.EMPTY_LIST, inferred=True)
    if name.startswith(("exists", "has_")):
        return MethodPolicy(name, Kind.READ, Fallback.FALSE, inferred=True)
    if name.startswith(_READ_PREFIXES):
        return MethodPolicy(name, Kind.READ, single_item=True, inferred=True)
    return MethodPolicy(name, Kind.UPSERT, repeat_safe=False, inferred=True)


class PolicyTable:
    """Policies by method name: the built-in table, legacy aliases, user overrides, inference."""

    def __init__(
        self, policies: Mapping[str, MethodPolicy], aliases: Mapping[str, str] | None = None
    ) -> None:
        self._policies = dict(policies)
        self._aliases = dict(aliases or {})

    @classmethod
    def for_state_store(cls) -> PolicyTable:
        """The table of every StateStore method, plus the ArtifactStore methods for
        stores that implement that protocol directly."""
        return cls(
            {policy.name: policy for policy in [*artifact_store_policies(), *state_store_policies()]}, ALIASES
        )

    @classmethod
    def for_artifact_store(cls) -> PolicyTable:
        """The table of the ArtifactStore methods of a guarded store's ``artifact_store``: a put the
        backend cannot take is dead-lettered (kept in process and held for replay, see
        :mod:`guarded.layers.artifact_fallback`)."""
        return cls(
            {
                policy.name: replace(policy, dead_letter=policy.local_fallback is LocalFallback.PUT)
                for policy in artifact_store_policies()
            }
        )

    @classmethod
    def for_snapshot_store(cls) -> PolicyTable:
        """The table of the :class:`~guarded.snapshots.SnapshotStore` methods
        (:func:`guarded.snapshots.guarded.guard_snapshots`): ``save``, ``tag`` and ``untag`` retried
        (idempotent); a ``save`` the backend cannot take staged and held (:attr:`MethodPolicy.staged`);
        ``get``, ``list``, ``lineage`` and ``diff`` stale-if-error;
        ``load`` a plain read; ``delete`` and ``gc`` never retried blindly."""
        return cls({policy.name: policy for policy in snapshot_store_policies()})

    def get(self, name: str) -> MethodPolicy:
        """The policy of ``name``: explicit entry, else its alias target's, else inferred."""
        policy = self._policies.get(name)
        if policy is not None:
            return policy
        target = self._aliases.get(name)
        if target is not None and target in self._policies:
            return replace(self._policies[target], name=name, alias_of=target)
        return infer_policy(name)

    def with_overrides(self, overrides: Mapping[str, Mapping[str, Any] | MethodPolicy]) -> PolicyTable:
        """A copy with entries replaced (a full :class:`MethodPolicy`) or patched (a mapping of fields)."""
        table = PolicyTable(self._policies, self._aliases)
        for name, override in overrides.items():
            if isinstance(override, MethodPolicy):
                table._policies[name] = replace(override, name=name)
            else:
                base = self.get(name)
                patch = dict(override)
                for enum_field, enum_type in (("kind", Kind), ("fallback", Fallback)):
                    if isinstance(patch.get(enum_field), str):
                        patch[enum_field] = enum_type(patch[enum_field])
                if "kind" in patch and "repeat_safe" not in patch:
                    patch["repeat_safe"] = patch["kind"] is not Kind.CONSUME
                table._policies[name] = replace(base, **patch, inferred=False)
        return table

    def __iter__(self) -> Iterator[MethodPolicy]:
        """The table's own entries (not its aliases, nor inferred policies)."""
        return iter(self._policies.values())

    def merges_from(self, write: str) -> frozenset[Merge]:
        """How the reads of the table see the held writes of ``write`` (empty when none does)."""
        return frozenset(
            policy.merge
            for policy in self._policies.values()
            if policy.merge_from == write and policy.merge is not None
        )

    def __contains__(self, name: object) -> bool:
        return name in self._policies or name in self._aliases


__all__ = ["PolicyTable", "infer_policy"]
