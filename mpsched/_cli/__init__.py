"""``python -m mpsched``: ``main(argv) -> int`` (``main``), the grammar (``parser``; the
shared connection options in ``options``, each command's own in ``serve_options``,
``submit_options``, ``query_options`` and ``stress_options``, the types that read their
values in ``values``), how a command reaches its manager (``connection``), how it writes
numbers and times (``formats``), and one module per group of commands: ``serve``,
``status``, ``jobs`` (jobs, cancel, result), ``schedules``, ``demo``, ``stress`` (its
producers in ``stress_producers``, its checks and report in ``stress_report``, its run on
a shared store in ``stress_shared``).

May import every package; nothing imports it but ``mpsched.__main__``.
"""
