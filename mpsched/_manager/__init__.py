"""The manager process: the service it serves (queue, journals with and without a store,
schedules with their run planner and wall-clock watcher, mailboxes, the workers table,
recent failures, retried jobs' notes), the supervisor of its local workers, and how a
Scheduler starts it.

May import every package below it: ``_errors`` up to ``_worker``; never ``_client`` or
``_cli``.
"""
