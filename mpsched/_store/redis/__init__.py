"""The Redis store: one queue in Redis that several managers share as peers.

``url`` parses and redacts store URLs (``redis://``, ``rediss://``, ``unix://``) without
importing redis-py; ``server`` connects and checks the server's version and settings;
``records`` are what crosses between a manager and the store; ``script_runner`` calls the
Lua scripts (``lua/``) by SHA, each thread on its own connection (and tells a script whose
answer was lost from one that never went out); ``scripts`` builds their arguments and reads
their replies: they submit, claim, finish, cancel and reap atomically on the server's
clock. ``session`` holds the client, its channels and the store's errors; ``cancels``,
``membership`` (heartbeats, the inbox), ``job_changes``, ``listings`` (over ``views``) and
``schedules`` are the store's collaborators; ``subscription`` reads the channels;
``store`` is :class:`RedisStore`, the Python side of them all, whose docstring names every
key under the deployment's hash tag. redis-py (with hiredis) is the optional extra
``mpsched[redis]``.

May import: ``_errors``, ``_core``, ``_store.base``.
"""
