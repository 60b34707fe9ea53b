"""The manager's HTTP status server: a live page, a Prometheus ``/metrics`` endpoint and a
JSON API, served from a thread of the manager process (``serve --http``,
``Scheduler(http=...)``).

``metrics`` renders the Prometheus text format and ``views`` the JSON, both from copies of
the manager's counters; ``history`` keeps the lateness histogram's recent past for the
page's chart; ``server`` is the listener with its limits (time, sizes), TLS and token
check, ``connections`` counts its open connections against their caps and deadlines;
``routes`` maps requests to answers. ``page.html`` is the page, one
file with its script and style inline.

May import everything ``mpsched._manager`` may, and the manager's own modules up to
``service``; never ``_client`` or ``_cli``.
"""
