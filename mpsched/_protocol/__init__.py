"""What crosses a process boundary: the records (hellos, reports, exit codes), their wire
codec, and the proxy every client and worker calls the manager through.

``records`` (the typed records and exit codes), ``codec`` (the flat tuples of the per-job
messages) and ``proxy`` (ServiceProxy, and what a served service exposes).

May import: ``_errors``, ``_core``, ``_transport``.
"""
