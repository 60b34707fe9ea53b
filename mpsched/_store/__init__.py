"""Job stores: the Store interface (``base``) and its backends: the journal stores memory
and SQLite (with its group-commit writer, the lease log and the file's schema and lock),
and the shared store Redis (``redis/``: URLs, server checks, Lua scripts, RedisStore).

A store records jobs as opaque bytes and never unpickles them. May import: ``_errors``,
``_core``.
"""
