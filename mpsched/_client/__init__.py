"""The submitting side: Client (the Executor), its futures and their result thread, the
write-behind outbox, outages and reconnects, schedule handles, and Scheduler.

May import every package below it, ``_manager`` only to start a manager process
(``_manager.process``). Never ``_cli``.
"""
