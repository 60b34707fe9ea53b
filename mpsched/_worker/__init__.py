"""The worker process: its take-run-report loop, remote worker pools
(``python -m mpsched worker``) and process-tree kills.

May import every package above except ``_manager``, ``_client`` and ``_cli``.
"""
