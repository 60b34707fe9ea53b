"""The Redis store: one queue in Redis that several managers share as peers.

``url`` parses and redacts store URLs (``redis://``, ``rediss://``, ``unix://``) without
importing redis-py; ``server`` connects and checks the server's version and settings;
``keys`` names every key under the deployment's hash tag; ``scripts`` loads the Lua
scripts (``lua/``) that submit, claim, finish, cancel and reap atomically on the server's
clock; ``store`` is :class:`RedisStore`, the Python side of them. redis-py (with hiredis)
is the optional extra ``mpsched[redis]``.

May import: ``_errors``, ``_core``, ``_store.base``.
"""
