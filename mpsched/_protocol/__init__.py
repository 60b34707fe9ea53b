"""What crosses a process boundary: the records (hellos, reports, exit codes), their wire
codec, and the proxy every client and worker calls the manager through.

May import: ``_errors``, ``_core``, ``_store``, ``_transport``.
"""
