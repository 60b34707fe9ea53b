"""Job payloads: cloudpickling by value, pickling with out-of-band buffers, POSIX
shared-memory segments, who owns and unlinks each, and a client's reusable segments.

May import: ``_errors``, ``_core``, ``_store``, ``_transport``, ``_protocol``.
"""
