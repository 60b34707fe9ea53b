"""Getting bytes between processes safely: authkeys, TLS, message framing (FastConnection),
handshakes and the hardened listener, and the local manager's runtime directory.

Knows nothing of jobs. May import: ``_errors``.
"""
