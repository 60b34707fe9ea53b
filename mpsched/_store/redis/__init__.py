"""The Redis store: one queue in Redis that several managers share as peers.

``url`` parses and redacts store URLs (``redis://``, ``rediss://``, ``unix://``) without
importing redis-py; ``server`` connects and checks the server's version and settings;
``records`` are what crosses between a manager and the store; ``scripts`` loads the Lua
scripts (``lua/``) that submit, claim, finish, cancel and reap atomically on the server's
clock (and tells a script whose answer was lost from one that never went out);
``views`` reads the listings and counters, ``schedules`` the recurring schedules,
``subscription`` the channels; ``store`` is :class:`RedisStore`, the Python side of them
all, whose docstring names every key under the deployment's hash tag. redis-py (with
hiredis) is the optional extra ``mpsched[redis]``.

May import: ``_errors``, ``_core``, ``_store.base``.
"""
