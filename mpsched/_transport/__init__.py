"""Getting bytes between processes safely: addresses, authkeys, TLS, message framing
(FastConnection), handshakes, the client's end of a connection (``connect``) and the
hardened server (``sockets``), and the local manager's runtime directory.

Knows nothing of jobs. May import: ``_errors``.
"""
