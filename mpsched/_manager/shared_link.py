"""SharedLink: the two threads that tie a manager to its shared Redis store.

- the subscriber listens on the deployment's wake-up channel (a new head, a free lead:
  one waiting taker looks again), on this manager's own channel (its inbox has ends of
  its clients' jobs: it drains them and delivers them), and on the schedules channel;
  after each (re)connection it wakes a taker and drains the inbox, for whatever it
  missed while it was not listening;
- the heartbeat renews this manager's leases every third of ``lease_timeout``, publishes
  its status (``status`` shows every manager), takes back the jobs of managers presumed
  dead, sends again the finishes Redis could not take, and drops forgotten jobs from the
  listings.

While Redis does not answer, both retry with back-off (0.1 s doubling to 1 s), and the
manager logs one WARNING for the outage and one when Redis is back, with how long it was
away; then every taker looks again at once, and the ends held meanwhile are sent. Jobs
that run go on running. Neither thread polls: each sleeps on a socket or an event.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable

from mpsched._core.job import JobState
from mpsched._errors import StoreError, StoreUnavailableError
from mpsched._manager.shared_journal import SharedJournal, log_revived
from mpsched._manager.shared_queue import SharedQueue
from mpsched._manager.store_outage import StoreOutage
from mpsched._store.redis.records import StoredEnd
from mpsched._store.redis.scripts import parse_cancel_request, parse_ended
from mpsched._store.redis.store import RedisStore
from mpsched._store.redis.subscription import Subscription

log = logging.getLogger("mpsched.manager")

BACKOFF = (0.1, 1.0)  # seconds between tries while Redis is down, doubling
LISTEN = 60.0  # longest the subscriber sleeps on its socket before it looks at its flag
PRUNE_EVERY = 30  # heartbeats between two prunes of the listing indexes
REAP_MARGIN = 0.005  # a beat that takes back a dead peer's jobs comes this late after its lease


class SharedLink:
    """The subscriber and heartbeat threads of one manager (see the module docstring).

    Args:
        status: this manager's status, encoded, for its heartbeats.
        on_schedule: called with a schedule id when some manager changed it.
    """

    def __init__(
        self,
        store: RedisStore,
        queue: SharedQueue,
        journal: SharedJournal,
        *,
        outage: StoreOutage,
        status: Callable[[], bytes],
        on_schedule: Callable[[str], None] | None = None,
    ) -> None:
        self._store = store
        self._queue = queue
        self._journal = journal
        self._outage = outage
        self._status = status
        self._on_schedule = on_schedule or (lambda schedule_id: None)
        self._me = queue.manager_id
        self._channels = {
            store.base + "wake": self._on_wake,
            f"{store.base}ch:{self._me}": self._on_inbox,
            store.base + "sched": self._on_sched,
        }
        # Set when the link stops; both threads wait on it between tries.
        self._stopping = threading.Event()
        # Set to ask for a heartbeat now (a claim found this manager presumed dead);
        # the heartbeat thread waits on it between beats.
        self._beat_now = threading.Event()
        # Set by the subscriber once it listens (start() waits for the first time).
        self._listening = threading.Event()
        self._registered = False
        # Held while the inbox is drained (the subscriber, or the heartbeat thread when
        # this manager was presumed dead); guards _drained: the ends the last drain
        # returned and this manager delivered, which the next drain drops. Nobody waits
        # on it but another drain.
        self._draining = threading.Lock()
        self._drained = 0
        self._next_expiry: float | None = None  # written and read by the beating thread
        self._threads: list[threading.Thread] = []
        queue.fence.on_ask(self._beat_now.set)  # a taker whose leases may have run out
        outage.on_back(queue.wake_all)
        outage.on_back(self._beat_now.set)  # send what waited for the store

    def start(self) -> None:
        """Register this manager (its first heartbeat), then start listening; returns
        once the subscriber listens, so that no wake-up is missed after it.

        Raises:
            StoreError: Redis refused the first heartbeat.
            ConfigError: a live manager of the store runs with another order.
        """
        self._beat()
        for name, target in (("subscriber", self._listen), ("heartbeat", self._beats)):
            thread = threading.Thread(target=target, name=f"mpsched-redis-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        self._listening.wait(10.0)

    def beat_now(self) -> None:
        self._beat_now.set()

    def stop(self) -> None:
        """Stop both threads, then leave the store (nothing this manager ran is leased
        any more: its jobs ended or went back)."""
        self._stopping.set()
        self._beat_now.set()
        # Redis down: the subscriber is in a back-off wait, which the event ends.
        with contextlib.suppress(Exception):
            self._store.client.publish(f"{self._store.base}ch:{self._me}", "stop")
        for thread in self._threads:
            thread.join(10.0)
        try:
            self._send_unsent()
            if not self._journal.has_unsent() and not self._queue.held():
                back = self._store.forget_manager(self._me)
                if back:
                    log.warning(
                        "%d job(s) still leased to this manager as it left (claims "
                        "whose answers were lost) went back to the queue",
                        back,
                    )
        except StoreError as exc:
            log.warning(
                "could not leave the job store (%s): peers take back what this "
                "manager held once its lease runs out",
                exc,
            )

    # ------------------------------------------------------------------ subscriber

    def _listen(self) -> None:
        pause = BACKOFF[0]
        while not self._stopping.is_set():
            subscription: Subscription | None = None
            try:
                subscription = self._store.subscribe(list(self._channels))
                self._listening.set()
                pause = BACKOFF[0]
                self._serve(subscription)
            except Exception as exc:  # a lost connection, a bug: the thread goes on
                if self._stopping.is_set():
                    break
                self._store_error(exc)
                self._stopping.wait(pause)
                pause = min(pause * 2, BACKOFF[1])
            finally:
                if subscription is not None:
                    subscription.close()

    def _serve(self, subscription: Subscription) -> None:
        """Hand each message to its handler until the link stops. A handler that fails
        (its own call to Redis: a connection from before a restart) keeps the
        subscription, whose messages would be lost with it; a drain that failed is tried
        again within BACKOFF[1].

        Raises:
            StoreUnavailableError: the subscription's connection was lost.
        """
        self._queue.wake()  # what was said while it did not listen
        owed = not self._handled(self._on_inbox)
        inbox = f"{self._store.base}ch:{self._me}"
        while not self._stopping.is_set():
            message = subscription.message(BACKOFF[1] if owed else LISTEN)
            if message is not None:
                channel, data = message
                handler = self._channels.get(channel, self._on_wake)
                if not self._handled(functools.partial(handler, data)) and channel == inbox:
                    owed = True
            if owed:
                owed = not self._handled(self._on_inbox)

    def _handled(self, handle: Callable[[], object]) -> bool:
        """Run a message's handler; False (said, as any failed call) if Redis failed it."""
        try:
            handle()
        except StoreError as exc:
            self._store_error(exc)
            return False
        return True

    def _on_wake(self, data: object = None) -> None:
        self._queue.wake()

    def _on_inbox(self, data: object = None) -> None:
        """Deliver the ends of jobs that came whole in the message, or every end in this
        manager's inbox; or give back the prefetched jobs a cancel waits for."""
        whole = parse_ended(data) if isinstance(data, bytes) else None
        if whole is not None:
            self._journal.deliver_ended(whole)
            return
        request = parse_cancel_request(data) if isinstance(data, bytes) else None
        if request is not None:
            nonce, job_ids = request
            self._queue.give_back_for_cancel(job_ids, nonce)
            return
        with self._draining:
            while True:
                ended = self._store.drain(self._me, done=self._drained)
                self._drained = 0
                if not ended:
                    return
                self._journal.deliver_ended(ended)
                self._drained = len(ended)  # dropped from the inbox by the next drain

    def _on_sched(self, data: object = None) -> None:
        schedule_id = data.decode() if isinstance(data, bytes) else str(data)
        self._on_schedule(schedule_id)

    # ------------------------------------------------------------------ heartbeat

    def _beats(self) -> None:
        pause = BACKOFF[0]
        beats = 0
        while not self._stopping.is_set():
            wait = self._queue.lease_timeout / 3 if not self._outage.down else pause
            if self._next_expiry is not None and not self._outage.down:
                wait = min(wait, self._next_expiry + REAP_MARGIN)
            self._beat_now.wait(wait)
            self._beat_now.clear()
            if self._stopping.is_set():
                return
            try:
                self._beat()
                self._send_unsent()
                beats += 1
                if beats % PRUNE_EVERY == 0:
                    self._store.prune()
                pause = BACKOFF[0]
            except Exception as exc:
                self._store_error(exc)
                pause = min(pause * 2, BACKOFF[1])

    def _beat(self) -> None:
        """Renew this manager's leases, show its status, take back dead peers' jobs."""
        sent, sent_ns = self._queue.clock.now(), time.monotonic_ns()
        beat = self._store.heartbeat(
            self._me, self._queue.lease_timeout, self._status(), join=not self._registered
        )
        if self._registered and not beat.registered_before:
            self._queue.fence.taken_back(self._queue.next_lease_id())
        self._queue.fence.renewed(sent, sent_ns)
        self._outage(None)
        # The next beat comes when the first peer's lease would run out: a dead peer's
        # jobs are taken back then, not up to a third of our own lease later.
        self._next_expiry = beat.next_expiry
        if self._registered and not beat.registered_before:
            log.warning(
                "this manager was presumed dead by its peers (no heartbeat for "
                "%g s): its jobs were taken back; those not started yet are not "
                "started here",
                self._queue.lease_timeout,
            )
            self._queue.wake()
            self._on_inbox()  # the ends its clients are owed, kept while it was away
        self._registered = True
        for taken in beat.taken_back:
            silent = f"{taken.lease_timeout:g} s" if taken.lease_timeout >= 0 else "its lease"
            log.warning(
                "manager %s stopped renewing its leases for %s: presumed dead; "
                "its jobs were taken back (%d retried, %d failed)",
                taken.manager,
                silent,
                taken.requeued,
                taken.failed,
            )
        mine = _crashed(beat.failed, self._me)
        if mine:
            self._journal.deliver_ended(mine)

    def _send_unsent(self) -> None:
        """Send again the finishes, and the prefetched jobs given back, that Redis could
        not take; undo the claims whose answers were lost (Redis answered a beat since)."""
        self._queue.doubts.settle()
        self._recheck()
        unsent = self._journal.take_unsent()
        unreturned = self._queue.give_backs.take_unreturned()
        if not unsent and not unreturned:
            return
        try:
            reply = self._store.report(
                self._me, self._queue.lease_timeout, finishes=unsent, requeues=unreturned
            )
        except StoreError:
            self._journal.put_back_unsent(unsent)
            self._queue.give_backs.put_back_unreturned(unreturned)
            raise
        for finish, result in zip(unsent, reply.finished, strict=True):
            if result == 3:
                log_revived(finish.job_id)
            if result == 0:
                log.warning(
                    "the end of job %s came too late: its lease had run out and "
                    "a peer took the job back",
                    finish.job_id,
                )

    def _recheck(self) -> None:
        """Tell this manager's clients the ends of jobs that a call whose answer was lost
        may have made (a cancel): each is looked up, and watched if it goes on."""
        job_ids = self._queue.doubts.take_recheck()
        ended = []
        try:
            for job_id in job_ids:
                end = self._store.watch(self._me, job_id)
                if end is not None and end.state not in (JobState.PENDING, JobState.RUNNING):
                    ended.append(end)
        except StoreError:
            self._queue.doubts.recheck(job_ids)
            raise
        if ended:
            self._journal.deliver_ended(ended)

    def _store_error(self, exc: BaseException) -> None:
        if isinstance(exc, StoreUnavailableError):
            self._outage(exc)
        else:
            log.error("job store link: %s: %s", type(exc).__name__, exc)


def _crashed(failed: list[tuple[str, str, str, bool]], me: str) -> list[StoredEnd]:
    """Log the jobs failed with their workers as a beat took back a dead peer's jobs;
    the ends of those this manager delivers (``me``: its id)."""
    mine = []
    for job_id, worker, client, here in failed:
        log.error(
            "job %s: its worker %s went away with its manager; failed (WorkerCrashedError)",
            job_id,
            worker,
        )
        if here:
            mine.append(
                StoredEnd(
                    job_id=job_id,
                    state=None,
                    outcome=None,
                    crashed_worker=worker,
                    client_id=client,
                    owner=me,
                )
            )
    return mine
