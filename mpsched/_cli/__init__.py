"""``python -m mpsched``: ``main(argv) -> int``, the parser, and one module per group of
commands (serve, jobs, schedules, demo, stress).

May import every package; nothing imports it but ``mpsched.__main__``.
"""
