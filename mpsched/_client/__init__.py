"""The submitting side: Client (the Executor, ``client``) and the collaborator it holds for
each role (``submit_path``, ``dependents``: jobs with parents, ``known_limits``,
``lookups``, ``recurring``: schedules, ``closing``: shutdown, leaving, the exit hook;
``dialing``: ``connect()``'s connection), its futures and their result thread (``core``,
``results``, ``job_future``), the write-behind outbox, outages and reconnects (``link``,
``outage``), schedule handles (``schedule_handle``), and Scheduler (``scheduler``, with
``manager_closing``).

May import every package below it, ``_manager`` only to start a manager process
(``_manager.launcher``). Never ``_cli``.
"""
