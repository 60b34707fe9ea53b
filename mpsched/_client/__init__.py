"""The submitting side: Client (the Executor) in layers (``base``: its core and lookups by
id; ``recurring``: schedules; ``closing``: shutdown, leaving, the exit hook; ``client``:
submitting, and ``connect()``), its futures and their result thread (``core``,
``results``, ``job_future``), the write-behind outbox, outages and reconnects (``link``,
``outage``), schedule handles (``schedule_handle``), and Scheduler (``scheduler``).

May import every package below it, ``_manager`` only to start a manager process
(``_manager.launcher``). Never ``_cli``.
"""
