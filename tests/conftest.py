from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # job modules import as top-level `jobs`

from processes import Programs

from mpsched import Scheduler
from mpsched._payload import shm

# Tests press Ctrl-C (SIGINT) on programs they start. A runner started in the background by
# a shell without job control (`make test &` in a script, nohup) ignores SIGINT, its
# children would inherit that, and Python installs no KeyboardInterrupt handler in a
# process that starts with SIGINT ignored. A handler here is reset to the default in each
# child at exec, as in a runner started from a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config: pytest.Config) -> None:
    """Temporary directories under a short base of their own: tests put Unix sockets in
    them (multiprocessing's forkserver too, in TMPDIR), whose paths must fit in 108
    bytes, and pytest's default base is long, longer still per process with -n."""
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        config.option.basetemp = tempfile.mkdtemp(prefix="mpt-")
        config.add_cleanup(lambda: shutil.rmtree(config.option.basetemp, ignore_errors=True))


def stop_hard(scheduler: Scheduler) -> None:
    """Stop a scheduler and its processes whatever state a test left it in: a job a test
    left running is killed with its worker, not waited for (the manager's drain)."""
    scheduler.shutdown(wait=False, cancel_futures=True)
    process = getattr(scheduler, "_manager_process", None)
    if process is not None:
        process.stop_now()
    scheduler._finalizer()  # stops the manager, which stops its workers
    if scheduler._closing.closer is not None:
        scheduler._closing.closer.join(30)
        assert not scheduler._closing.closer.is_alive(), "shutdown thread did not finish"


@pytest.fixture(autouse=True)
def own_runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Each test's own XDG_RUNTIME_DIR, so that no test finds or touches the local manager
    (socket, key, lock) of the user running the tests. Short: a Unix socket's path must fit
    in 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="mps-"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fifo(tmp_path: Path) -> str:
    """A named pipe a job can announce itself on (see processes.wait_started)."""
    path = str(tmp_path / "started.fifo")
    os.mkfifo(path)
    return path


@pytest.fixture
def prefix() -> Iterator[str]:
    """This process's shared-memory segment prefix; whatever a test leaves under it is
    removed after, and must be gone already for the test to pass."""
    mine = shm.manager_prefix(os.getpid())
    shm.sweep(mine)
    yield mine
    left = shm.names(mine)
    shm.sweep(mine)
    assert not left, f"segments left behind: {left}"


@pytest.fixture
def make_scheduler() -> Iterator[Callable[..., Scheduler]]:
    """Build schedulers that are always stopped when the test ends."""
    made: list[Scheduler] = []

    def make(**options: Any) -> Scheduler:
        scheduler = Scheduler(**options)
        made.append(scheduler)
        return scheduler

    yield make
    for scheduler in made:
        stop_hard(scheduler)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Any]:
    """Starts ``python -m mpsched`` subprocesses (served.Processes); all are killed, with
    their process groups, when the test ends."""
    from served import Processes

    started = Processes(tmp_path)
    yield started
    started.stop_all()


@pytest.fixture
def programs(tmp_path: Path) -> Iterator[Programs]:
    """Runs user programs (processes.Programs); each is killed, with all it started, when
    the test ends."""
    started = Programs(tmp_path)
    yield started
    started.stop_all()


@pytest.fixture
def connect_client() -> Iterator[Callable[..., Any]]:
    """In-process clients of a ``serve`` manager (served.Manager), detached at the end."""
    import mpsched

    clients: list[mpsched.Client] = []

    def make(manager: Any, **options: Any) -> mpsched.Client:
        clients.append(mpsched.connect(manager.address, authkey=manager.key, **options))
        return clients[-1]

    yield make
    for client in clients:
        client.detach()


@pytest.fixture(scope="session")
def shared_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One redis-server of the test run's own (never the system's), for the tests that
    only need a server: each of them works under a prefix of its own (``redis_url``)."""
    from redis_server import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def redis_url(shared_redis: Any, request: pytest.FixtureRequest) -> str:
    """A store URL on the shared redis-server, under a prefix no other test uses."""
    name = "".join(c if c.isalnum() else "_" for c in request.node.name)[-40:]
    return str(shared_redis.url(prefix=f"t{os.getpid()}_{name}_{next(_prefixes)}"))


_prefixes = iter(range(1_000_000))


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Start redis-servers of this test's own (``own_redis(appendonly="yes", ...)``), so it
    may kill, pause or restart them; each is stopped when the test ends."""
    from redis_server import RedisServer

    started: list[RedisServer] = []

    def start(**config: Any) -> RedisServer:
        started.append(RedisServer(tmp_path / f"redis{len(started)}", **config))
        return started[-1]

    yield start
    for server in started:
        server.stop()
