"""Job stores: the Store interface (``base``) and its backends: the journal stores memory
and SQLite, and the shared store Redis (``redis/``: URLs, server checks, Lua scripts,
RedisStore). SQLite's parts: ``sqlite`` (SQLiteStore), ``statements`` (its SQL),
``readers``, ``writer`` (group commit) with ``commit`` (one batch's transaction) and
``pruning``, ``lease_log`` with ``lease_records`` and ``group_sync`` (its fdatasync
thread), and ``file`` (schema and lock).

A store records jobs as opaque bytes and never unpickles them. May import: ``_errors``,
``_core``.
"""
