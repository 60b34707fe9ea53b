"""What becomes of a client's jobs while it has lost its manager, and after.

The result thread of a client that can reconnect rides an outage out here (:func:`ride_out`):

- the outbox is paused: it takes no submit (they raise at once) and sends nothing; a batch
  whose call lost its connection is in doubt: it may or may not have reached the manager;
- without a store, the manager keeps nothing for a client that lost its connection: every
  outstanding future fails at once (a job never sent did not run; one sent may have run, or
  still run), and the client reconnects for the jobs submitted after;
- with a store, the futures wait: once a manager answers at the address again, it is asked
  about every outstanding job by id (``watch_many``): those that ended resolve, the others
  resolve when they end, a batch in doubt that it does not know is sent again (it never
  got it: a store journals a batch before the reply, and a batch lands whole or not at
  all), and any other job it does not know fails (a manager started without the store);
- then the outbox resumes, with what was left unsent, and submits are taken again.
"""

from __future__ import annotations

import logging
from typing import Protocol

from mpsched._client.link import ManagerLink, Outage, Rejoin
from mpsched._client.outbox import SENDER_THREAD, Outbox
from mpsched._core.job import JobRequest, Outcome
from mpsched._errors import AuthenticationError, MpschedError, VersionMismatchError

log = logging.getLogger("mpsched.client")


class ClientJobs(Protocol):
    """What riding out an outage needs of a client's futures (mpsched._client.core)."""

    def job_ids(self) -> list[str]:
        """The ids of the jobs the client waits for."""

    def take_in_doubt(self) -> list[JobRequest]:
        """The requests of batches whose call lost its connection, handed over."""

    def resolve(self, outcome: Outcome) -> None:
        """Resolve a job's future with its outcome (nothing if it has none any more)."""

    def fail(self, job_ids: list[str], error: MpschedError) -> None:
        """Fail the futures of these jobs, of those it still has."""

    def fail_all(self, error: MpschedError) -> None:
        """Fail every future it has."""


def ride_out(
    link: ManagerLink, outage: Outage, jobs: ClientJobs, outbox: Outbox | None
) -> MpschedError | None:
    """Reconnect, if the client can, and carry its jobs over; returns None once it has,
    else the error its futures fail with."""
    if not link.reconnects:
        return outage.error(link.advice())
    watch = _hold(link, outage, jobs, outbox)
    try:
        rejoin = link.reconnect(watch, sender=None if outbox is None else SENDER_THREAD)
    except (AuthenticationError, VersionMismatchError) as exc:
        log.error(
            "mpsched client %s: the manager at %s refused it: %s; it stops reconnecting",
            link.hello.client_id,
            link.address,
            exc,
        )
        return outage.error(f"the manager now there refused this client: {exc}")
    if rejoin is None:
        kept = (
            (
                "; the manager's store keeps its jobs: look them up by id (Client.job) from "
                "another client"
            )
            if link.durable
            else ""
        )
        return outage.error(link.advice() + kept)
    _carry_over(link, outage, jobs, outbox, rejoin, len(watch))
    return None


def _hold(link: ManagerLink, outage: Outage, jobs: ClientJobs, outbox: Outbox | None) -> list[str]:
    """Stop sending, say so, and fail what no manager will tell of; returns the ids of the
    jobs to ask the manager about once it is back (none without a store)."""
    if outbox is not None:
        outbox.pause()  # takes nothing more, sends nothing more
        outbox.wait_idle()  # a batch on its way is in doubt now, or sent
    unsent = set() if outbox is None else outbox.unsent()
    watch = [job_id for job_id in jobs.job_ids() if job_id not in unsent]
    link.announce(outage, len(watch) + len(unsent))
    if link.durable:
        return watch
    never_sent = [] if outbox is None else outbox.withdraw_all(counted=False)
    jobs.fail(
        never_sent,
        outage.error(
            "the job was never sent, and did not run: submit "
            "it again once this client has reconnected"
        ),
    )
    jobs.fail_all(
        outage.error(
            "without a store the manager keeps no outcome for a "
            "client that lost its connection: the job may have run, "
            "or may still run"
        )
    )
    return []


def _carry_over(
    link: ManagerLink,
    outage: Outage,
    jobs: ClientJobs,
    outbox: Outbox | None,
    rejoin: Rejoin,
    watched: int,
) -> None:
    """The manager is back (``rejoin``): resolve what ended, send again the batches in
    doubt it never got, fail the other jobs it does not know, and let the outbox go on."""
    for outcome in rejoin.outcomes:
        jobs.resolve(outcome)
    in_doubt = {request.job_id: request for request in jobs.take_in_doubt()}
    resend = [in_doubt[job_id] for job_id in rejoin.unknown if job_id in in_doubt]
    unknown = [job_id for job_id in rejoin.unknown if job_id not in in_doubt]
    jobs.fail(
        unknown,
        outage.error(
            "the manager that answers there now does not know the "
            "job (started without the store, or the job was "
            "forgotten)"
        ),
    )
    link.rejoined(rejoin)
    if outbox is not None:
        outbox.resume(rejoin.service, resend, rejoin.sender)  # before submits are taken
    link.restored(outage, watched - len(rejoin.unknown), len(resend), len(unknown))
