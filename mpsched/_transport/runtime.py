"""The local manager's place: one runtime directory per user, with its socket, key and lock.

``python -m mpsched serve`` without ``--address`` listens on ``manager.sock`` in this
directory, and every client command without ``--connect`` (and ``mpsched.connect()``
without an address) connects there, so a user's commands find their manager with no
flags. The directory is ``$XDG_RUNTIME_DIR/mpsched`` when XDG_RUNTIME_DIR names a
directory this user owns and may write, else ``mpsched-<uid>`` in the temp directory
(``$TMPDIR``, else /tmp). It must be a directory (not a symlink) that this user owns, mode
0700: any other is refused (:class:`RuntimeDirError`), since whoever controls it could
remove or replace the socket and key in it. It holds:

- ``authkey``: this user's local key, mode 0600. The first serve that needs a key writes
  it (a complete file linked into place, so no reader sees half a key) and every later
  serve reuses it, so command lines and scripts keep working across restarts; delete it
  to get a new key at the next serve. A serve on a Unix socket or a loopback TCP address
  given no key uses it, and so does a client of such an address given no key.
- ``manager.pid``: the lock. The default serve holds an exclusive ``flock()`` on it for
  its whole life, with its pid written in it; a second default serve cannot take the lock
  and says which pid holds it. The kernel drops the lock when its process ends, SIGKILL
  included, so a serve that takes it knows that no other default serve runs. The file is
  never removed: removing a lock file lets two processes each lock a file of their own.
- ``manager.sock``: the default serve's socket, removed when it exits. One found there
  while nobody holds the lock is stale (its serve was killed with SIGKILL); the next
  default serve removes it once it holds the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
from pathlib import Path

from mpsched._errors import AuthenticationError, ManagerUnreachableError, RuntimeDirError
from mpsched._transport.address import Address, format_address, is_loopback
from mpsched._transport.authkey import AUTHKEY_ENV, read_authkey, user_name, write_authkey

RUNTIME_ENV = "XDG_RUNTIME_DIR"
SOCKET_NAME = "manager.sock"
KEY_NAME = "authkey"
LOCK_NAME = "manager.pid"


def runtime_dir() -> Path:
    """This user's runtime directory for the local manager (neither checked nor created)."""
    base = os.environ.get(RUNTIME_ENV, "")
    if base and _usable_base(base):
        return Path(base) / "mpsched"
    return Path(tempfile.gettempdir()) / f"mpsched-{os.geteuid()}"


def _usable_base(base: str) -> bool:
    """XDG_RUNTIME_DIR is usable: an absolute path to a directory we own and may write."""
    if not os.path.isabs(base):
        return False
    try:
        status = os.stat(base)
    except OSError:
        return False
    return (
        stat.S_ISDIR(status.st_mode)
        and status.st_uid == os.geteuid()
        and os.access(base, os.W_OK | os.X_OK)
    )


def default_address() -> str:
    """The local manager's socket: ``manager.sock`` in :func:`runtime_dir`."""
    return str(runtime_dir() / SOCKET_NAME)


def open_runtime_dir(*, create: bool) -> Path | None:
    """:func:`runtime_dir`, checked; made (mode 0700) if missing and ``create``, else None.

    Raises:
        RuntimeDirError: it is not a directory, not this user's, or not mode 0700, or it
            cannot be made.
    """
    path = runtime_dir()
    if create:
        try:
            os.mkdir(path, 0o700)
            os.chmod(path, 0o700)  # whatever the umask took away
        except FileExistsError:
            pass
        except OSError as exc:
            raise RuntimeDirError(str(path), f"cannot create it ({exc.strerror})") from None
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RuntimeDirError(str(path), exc.strerror or str(exc)) from None
    problem = _unsafe(status)
    if problem:
        raise RuntimeDirError(str(path), problem)
    return path


def _unsafe(status: os.stat_result) -> str:
    """Why a directory with this status is not ours to use, or ""."""
    if stat.S_ISLNK(status.st_mode):
        return "it is a symbolic link, not a directory"
    if not stat.S_ISDIR(status.st_mode):
        return "it is not a directory"
    if status.st_uid != os.geteuid():
        return (
            f"it belongs to {user_name(status.st_uid)}, not to "
            f"{user_name(os.geteuid())} who runs mpsched"
        )
    if stat.S_IMODE(status.st_mode) != 0o700:
        return f"its mode is {stat.S_IMODE(status.st_mode):o}, not 700 (chmod 700 it)"
    return ""


# ------------------------------------------------------------------------------ the key


def read_local_authkey() -> bytes | None:
    """This user's local key; None when no serve has written one yet.

    Raises:
        RuntimeDirError: the runtime directory is unsafe.
        AuthenticationError: the key file is unsafe, empty or unreadable.
    """
    directory = open_runtime_dir(create=False)
    if directory is None or not os.path.lexists(directory / KEY_NAME):
        return None
    return read_authkey(directory / KEY_NAME)


def ensure_local_authkey() -> tuple[bytes, Path]:
    """This user's local key and its file, which is written first if there is none.

    Raises:
        RuntimeDirError: the runtime directory is unsafe or cannot be made.
        AuthenticationError: the key file there is unsafe, empty or unreadable.
    """
    directory = open_runtime_dir(create=True)
    assert directory is not None  # made, or it raised
    path = directory / KEY_NAME
    if not os.path.lexists(path):
        draft = directory / f".{KEY_NAME}.{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(draft)  # left by a killed process that had our pid
        write_authkey(draft)
        try:
            os.link(draft, path)  # all of the key appears at once, or none
        except FileExistsError:
            pass  # another serve wrote it meanwhile: its key is the key
        finally:
            os.unlink(draft)
    key = read_authkey(path)
    assert key is not None  # read_authkey(path) returns a key or raises
    return key, path


def find_authkey(address: Address, path: str | os.PathLike[str] | None = None) -> bytes | None:
    """The key for a client of ``address``: the file ``path``, else MPSCHED_AUTHKEY, else,
    for a local address (a Unix socket, loopback TCP), this user's local key; else None.

    Raises:
        AuthenticationError: a key file is unsafe, empty or unreadable.
        RuntimeDirError: the runtime directory is unsafe.
    """
    key = read_authkey(path)
    if key is None and is_loopback(address):
        key = read_local_authkey()
    return key


def require_authkey(
    address: Address, path: str | os.PathLike[str] | None = None, *, give: str
) -> bytes:
    """:func:`find_authkey`, or the error that says why there is none.

    ``give`` completes "no authkey: ... or set MPSCHED_AUTHKEY" with how the caller passes
    a key (``"give --authkey-file (mode 0600)"``, ``"pass authkey="``).

    Raises:
        ManagerUnreachableError: the default address, and no serve has ever written the
            local key: no local manager can be running.
        AuthenticationError: no key for another address, or an unsafe key file.
        RuntimeDirError: the runtime directory is unsafe.
    """
    key = find_authkey(address, path)
    if key is not None:
        return key
    if address == default_address():
        raise ManagerUnreachableError(
            format_address(address),
            f"no local manager has run as this user (no key in "
            f"{runtime_dir()}); python -m mpsched serve starts one",
        )
    raise AuthenticationError(f"no authkey: {give} or set {AUTHKEY_ENV}")


# ------------------------------------------------------------------------------ the lock


def take_manager_lock(directory: Path) -> int | None:
    """Lock ``manager.pid`` in ``directory`` and write this process's pid in it.

    Returns the lock file's descriptor: keep it open for the rest of this process's life
    (never close it), since the lock lasts as long as the descriptor. None: another
    process holds the lock (:func:`lock_holder` says which).
    """
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def lock_holder(directory: Path) -> int | None:
    """The pid written in ``manager.pid``; None if there is none (yet)."""
    try:
        text = (directory / LOCK_NAME).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
