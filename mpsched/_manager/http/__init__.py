"""The manager's HTTP status server: a live page, a Prometheus ``/metrics`` endpoint and a
JSON API, served from a thread of the manager process (``serve --http``,
``Scheduler(http=...)``).

``metrics`` renders the Prometheus text format and ``views`` the JSON, both from copies of
the manager's counters; ``history`` keeps the lateness histogram's recent past for the
page's chart; ``server`` is the listener with its limits (time, sizes), token check and
the threads that answer requests; ``intake`` its accepting thread, which runs TLS
handshakes and reads request heads for every waiting connection; ``connections`` counts
the open connections against their caps (closing the oldest waiting one for room) and
deadlines; ``routes`` maps requests to answers. ``page.html`` is the page, one
file with its script and style inline.

May import everything ``mpsched._manager`` may, and the manager's own modules up to
``service``; never ``_client`` or ``_cli``.
"""
