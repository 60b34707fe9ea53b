"""Job payloads: cloudpickling by value, pickling with out-of-band buffers, POSIX
shared-memory segments (``shm``) and the frame in front of a payload that names its
segment or carries its buffers (``frames``), who owns and unlinks each segment, and a
client's reusable segments.

May import: ``_errors``, ``_core``, ``_store``, ``_transport``, ``_protocol``.
"""
