"""``python -m mpsched``: ``main(argv) -> int`` (``main``), the grammar (``parser``, each
command's options in ``options``), how a command reaches its manager (``connection``),
how it writes numbers and times (``formats``), and one module per group of commands:
``serve``, ``status``, ``jobs`` (jobs, cancel, result), ``schedules``, ``demo``, ``stress``.

May import every package; nothing imports it but ``mpsched.__main__``.
"""
