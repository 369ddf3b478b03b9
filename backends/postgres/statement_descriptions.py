"""Unnamed statements in one round trip, for a connection behind a transaction pooler.

Behind a pooler in transaction mode a named prepared statement may be missing on the next server
connection, so asyncpg's statement cache is off (``statement_cache_size=0``). asyncpg then asks
the server to describe every statement before running it: Parse, Describe and Flush, wait, then
Parse again with Bind, Execute and Sync -- two round trips per statement.

The description (parameter types, result columns and their codecs) depends only on the SQL text
and the schema, so :class:`DescribedStatementConnection` keeps it per connection, by SQL text.
A statement seen before goes out as Parse, Bind, Execute and Sync -- one message flow ending in a
Sync, which a transaction pooler never splits, and one round trip. The statement stays unnamed and
is parsed again by the server each time: nothing is kept on a server connection.

asyncpg writes the Parse of such a statement on its own, then Bind, Execute and Sync: two TCP
segments, each waking the pooler (and the server) -- about 25 µs per statement through PgBouncer
on loopback. The connection holds a lone Parse and sends it with the next write, which asyncpg makes
at once (a fallback sends it at the loop's next turn should nothing follow).

A description is dropped with asyncpg's own statement cache (``reload_schema_state()``, a codec
change, a statement that the server says changed its result type); at most
:data:`DESCRIPTIONS_PER_CONNECTION` are kept, the least recently used dropped first.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import asyncpg

DESCRIPTIONS_PER_CONNECTION = 512
"""How many statement descriptions a connection keeps (the store sends a few dozen statements per
schema)."""


class DescribedStatementConnection(asyncpg.Connection):
    """An asyncpg connection (statement cache off) that describes each SQL text once."""

    __slots__ = ("_descriptions",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._descriptions: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        asyncpg_side: Any = self
        send_parse_with_next_write(asyncpg_side._transport, asyncpg_side._loop)

    async def _get_statement(
        self,
        query: str,
        timeout: float | None,  # noqa: ASYNC109 (asyncpg's signature)
        *,
        named: Any = False,
        use_cache: bool = True,
        ignore_custom_codec: bool = False,
        record_class: Any = None,
    ) -> Any:
        # Only the statements asyncpg would have cached (fetch, execute with arguments, ...):
        # an explicit prepare(), and the cursors and introspection asyncpg runs, go their way.
        asyncpg_side: Any = self  # asyncpg's private attributes, untyped
        if named is not False or not use_cache or asyncpg_side._stmt_cache_enabled:
            return await super()._get_statement(  # type: ignore[misc]
                query,
                timeout,
                named=named,
                use_cache=use_cache,
                ignore_custom_codec=ignore_custom_codec,
                record_class=record_class,
            )
        key = (query, record_class, ignore_custom_codec)
        descriptions = self._descriptions
        statement = descriptions.get(key)
        if statement is not None:
            descriptions.move_to_end(key)
            return statement
        # Unnamed and marked unprepared by asyncpg (cache off): every run re-sends its Parse.
        statement = await super()._get_statement(  # type: ignore[misc]
            query, timeout, ignore_custom_codec=ignore_custom_codec, record_class=record_class
        )
        if not statement.name and not statement.prepared:
            descriptions[key] = statement
            if len(descriptions) > DESCRIPTIONS_PER_CONNECTION:
                descriptions.popitem(last=False)
        return statement

    def _drop_local_statement_cache(self) -> None:
        self._descriptions.clear()
        super()._drop_local_statement_cache()  # type: ignore[misc]


def _is_one_parse(data: Any) -> bool:
    return data[:1] == b"P" and len(data) == 1 + int.from_bytes(data[1:5], "big")


def send_parse_with_next_write(transport: Any, loop: Any) -> None:
    """Make ``transport`` hold a write that is exactly one Parse message and send it together with
    the next write (or at the loop's next turn). A transport whose ``write`` cannot be replaced
    (uvloop's) is left as it is."""
    write = transport.write
    held: list[bytes] = []

    def flush() -> None:
        if held:
            data = held[0]
            held.clear()
            write(data)

    def write_with_parse(data: Any) -> None:
        if held:
            data = held[0] + bytes(data)
            held.clear()
        elif _is_one_parse(data):
            held.append(bytes(data))
            loop.call_soon(flush)
            return
        write(data)

    try:
        transport.write = write_with_parse
    except AttributeError:
        return


__all__ = ["DESCRIPTIONS_PER_CONNECTION", "DescribedStatementConnection", "send_parse_with_next_write"]
