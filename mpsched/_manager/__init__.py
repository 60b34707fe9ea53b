"""The manager process: the service it serves (queue, journal, schedules, mailboxes, the
workers table), the supervisor of its local workers, and how a Scheduler starts it.

May import every package below it: ``_errors`` up to ``_worker``; never ``_client`` or
``_cli``.
"""
