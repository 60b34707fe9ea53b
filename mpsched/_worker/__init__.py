"""The worker process: its take-run-report loop (``loop``, why it ends: ``stop_reasons``), a
remote worker process (``remote``) and the pool that keeps them (``pool``, for
``python -m mpsched worker``), and process-tree kills.

May import every package above except ``_manager``, ``_client`` and ``_cli``.
"""
