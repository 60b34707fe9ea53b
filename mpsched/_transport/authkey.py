"""Authkeys: where they come from (a private file or the environment) and where they must
not go (child processes' environments, argv)."""

from __future__ import annotations

import os
import pwd
import secrets
import stat
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from mpsched._errors import AuthenticationError

AUTHKEY_ENV = "MPSCHED_AUTHKEY"


def read_authkey(path: str | os.PathLike[str] | None) -> bytes | None:
    """The key in the file ``path``, else the MPSCHED_AUTHKEY environment variable, else None.

    The key file holds the key as it is, any bytes: its content with surrounding
    whitespace (a trailing newline, say) stripped. It must belong to this process's
    effective user and be unreadable by group and others (mode 0600 or 0400), like an ssh
    private key. The environment variable's value is stripped the same way.

    Raises:
        AuthenticationError: the file is another user's, readable by others, empty, or
            unreadable.
    """
    if path is None:
        env = os.environ.get(AUTHKEY_ENV, "").strip()
        return env.encode() if env else None
    return read_secret(path, "authkey file")


def read_secret(path: str | os.PathLike[str], what: str) -> bytes:
    """The content of the file ``path`` with surrounding whitespace stripped: a secret, so
    the file must be as :func:`private_file_problem` says. ``what`` names such a file in
    messages ("authkey file").

    Raises:
        AuthenticationError: the file is another user's, readable by others, empty, or
            unreadable.
    """
    try:
        with open(path, "rb") as file:
            status = os.fstat(file.fileno())  # the file we read, not whatever the path is now
            secret = file.read().strip()
    except OSError as exc:
        raise AuthenticationError(f"cannot read {what} {path}: {exc}") from None
    problem = private_file_problem(f"{what} {path}", status)
    if problem:
        raise AuthenticationError(problem)
    if not secret:
        raise AuthenticationError(f"{what} {path} is empty")
    return secret


def private_file_problem(what: str, status: os.stat_result) -> str:
    """Why the file ``what`` (as a message names it: "authkey file /etc/key"), whose
    ``os.fstat`` is ``status``, cannot hold a secret; "" when it can: it belongs to this
    process's effective user, and neither its group nor others have any access (mode 0600
    or 0400), like an ssh private key."""
    if status.st_uid != os.geteuid():
        return (
            f"{what} belongs to {user_name(status.st_uid)}, not to "
            f"{user_name(os.geteuid())} who runs mpsched; use a key file of your own"
        )
    if status.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        return f"{what} is readable by others (mode {stat.S_IMODE(status.st_mode):o}); chmod 600 it"
    return ""


def user_name(uid: int) -> str:
    """How messages name the user ``uid``: its name and uid, else the uid alone."""
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def write_authkey(path: Path) -> bytes:
    """Create ``path`` with mode 0600 holding a fresh random key; return the key."""
    key = secrets.token_hex(32).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(key + b"\n")
    return key


def scrub_authkey_env(env: MutableMapping[str, str] | None = None) -> None:
    """Remove MPSCHED_AUTHKEY from ``env`` (default: this process's environment).

    Call it once the key has been read and before starting workers, so that neither they
    nor the jobs and subprocesses they start inherit the key. (A job still runs in a
    process that holds the key in memory: this stops accidental leaks, such as a job
    that logs its environment, not a hostile job.)
    """
    (os.environ if env is None else env).pop(AUTHKEY_ENV, None)


def child_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``env`` (default: this process's environment) without MPSCHED_AUTHKEY,
    for ``subprocess.Popen(env=...)``."""
    clean = dict(os.environ if env is None else env)
    scrub_authkey_env(clean)
    return clean
