"""The local manager's runtime directory, in-process: where it is, what is refused, the
local key and the lock. (tests/cli/test_cli_local.py runs real serve processes on it.)"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from mpsched import AuthenticationError, ManagerUnreachableError
from mpsched._errors import RuntimeDirError
from mpsched._transport.authkey import AUTHKEY_ENV
from mpsched._transport.runtime import (
    default_address,
    ensure_local_authkey,
    find_authkey,
    lock_holder,
    open_runtime_dir,
    read_local_authkey,
    require_authkey,
    runtime_dir,
    take_manager_lock,
)


@pytest.fixture(autouse=True)
def no_env_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(AUTHKEY_ENV, raising=False)


@pytest.fixture
def tmpdir_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No XDG_RUNTIME_DIR; the temp directory is ``tmp_path``."""
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


# ------------------------------------------------------------------------------ where


def test_the_directory_is_mpsched_in_xdg_runtime_dir(own_runtime_dir: Path) -> None:
    assert runtime_dir() == own_runtime_dir / "mpsched"
    assert default_address() == str(own_runtime_dir / "mpsched" / "manager.sock")


def test_without_xdg_runtime_dir_it_is_a_per_uid_directory_in_the_temp_dir(
    tmpdir_only: Path,
) -> None:
    assert runtime_dir() == tmpdir_only / f"mpsched-{os.geteuid()}"


@pytest.mark.parametrize("base", ["relative/dir", "missing", "a-file", "others"])
def test_an_unusable_xdg_runtime_dir_falls_back_to_the_temp_dir(
    base: str, tmpdir_only: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = {
        "relative/dir": "relative/dir",
        "missing": str(tmp_path / "missing"),
        "a-file": str(tmp_path / "a-file"),
        "others": str(tmp_path),
    }[base]
    (tmp_path / "a-file").write_text("")
    if base == "others":  # a directory that belongs to someone else
        monkeypatch.setattr(os, "geteuid", lambda: os.stat(tmp_path).st_uid + 1)
    monkeypatch.setenv("XDG_RUNTIME_DIR", path)
    assert runtime_dir() == tmpdir_only / f"mpsched-{os.geteuid()}"


def test_the_directory_is_made_0700_whatever_the_umask(own_runtime_dir: Path) -> None:
    assert open_runtime_dir(create=False) is None  # not made without create
    assert not runtime_dir().exists()
    before = os.umask(0o277)  # would leave r-x for the owner only
    try:
        made = open_runtime_dir(create=True)
    finally:
        os.umask(before)
    assert made == runtime_dir()
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    assert open_runtime_dir(create=True) == made  # there already: fine


@pytest.mark.parametrize("kind", ["mode-0755", "symlink", "file", "another-users"])
def test_an_unsafe_directory_is_refused_and_nothing_is_written_in_it(
    kind: str, own_runtime_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kind == "another-users":  # made in the temp dir by someone else, before us
        monkeypatch.delenv("XDG_RUNTIME_DIR")
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        real = os.geteuid()  # we cannot chown without root: be someone else instead
        monkeypatch.setattr(os, "geteuid", lambda: real + 1)
    path = runtime_dir()
    if kind == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        path.symlink_to(tmp_path / "elsewhere")
    elif kind == "file":
        path.write_text("")
    else:
        path.mkdir(mode=0o700)
        if kind == "mode-0755":
            path.chmod(0o755)
    problem = {
        "mode-0755": "its mode is 755, not 700 (chmod 700 it)",
        "symlink": "it is a symbolic link",
        "file": "it is not a directory",
        "another-users": "it belongs to ",
    }[kind]
    for call in (
        lambda: open_runtime_dir(create=True),
        lambda: open_runtime_dir(create=False),
        ensure_local_authkey,
        read_local_authkey,
        lambda: find_authkey(default_address()),
    ):
        with pytest.raises(RuntimeDirError) as caught:
            call()
        assert str(caught.value).startswith(f"refusing the runtime directory {path}: {problem}")
    assert isinstance(caught.value, AuthenticationError)
    assert isinstance(caught.value, PermissionError)
    target = tmp_path / "elsewhere" if kind == "symlink" else path
    if target.is_dir():
        assert list(target.iterdir()) == []


# ------------------------------------------------------------------------------ the key


def test_the_local_key_is_written_once_0600_and_reused(own_runtime_dir: Path) -> None:
    assert read_local_authkey() is None
    key, path = ensure_local_authkey()
    assert path == runtime_dir() / "authkey"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(key) == 64
    assert ensure_local_authkey() == (key, path)  # the next serve: the same key
    assert read_local_authkey() == key
    assert sorted(p.name for p in runtime_dir().iterdir()) == ["authkey"]  # no draft left


def test_a_key_written_meanwhile_by_another_serve_wins(
    own_runtime_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_link = os.link

    def raced(src: str, dst: str) -> None:  # another serve links its key first
        Path(dst).write_bytes(b"theirs\n")
        Path(dst).chmod(0o600)
        real_link(src, dst)

    monkeypatch.setattr(os, "link", raced)
    assert ensure_local_authkey() == (b"theirs", runtime_dir() / "authkey")
    assert sorted(p.name for p in runtime_dir().iterdir()) == ["authkey"]


def test_a_local_key_file_others_can_read_is_refused(own_runtime_dir: Path) -> None:
    _, path = ensure_local_authkey()
    path.chmod(0o644)
    for call in (ensure_local_authkey, read_local_authkey):
        with pytest.raises(AuthenticationError, match="chmod 600"):
            call()


def test_clients_find_the_local_key_for_local_addresses_only(
    own_runtime_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = ("/some/where.sock", ("127.0.0.1", 7000), ("localhost", 7000), default_address())
    assert [find_authkey(address) for address in local] == [None] * 4
    key, _ = ensure_local_authkey()
    assert [find_authkey(address) for address in local] == [key] * 4
    assert find_authkey(("10.0.0.5", 7000)) is None  # its key is not ours to guess
    mine = tmp_path / "key"
    mine.write_bytes(b"from-file\n")
    mine.chmod(0o600)
    monkeypatch.setenv(AUTHKEY_ENV, "from-env")
    assert find_authkey(default_address()) == b"from-env"
    assert find_authkey(default_address(), mine) == b"from-file"


def test_without_a_key_the_default_address_has_no_manager_others_no_key(
    own_runtime_dir: Path,
) -> None:
    with pytest.raises(ManagerUnreachableError) as caught:
        require_authkey(default_address(), give="pass authkey=")
    assert str(caught.value) == (
        f"no manager answers at unix:{default_address()}: no local manager has run as this "
        f"user (no key in {runtime_dir()}); python -m mpsched serve starts one"
    )
    for address in (("127.0.0.1", 7000), ("10.0.0.5", 7000)):
        with pytest.raises(AuthenticationError) as refused:
            require_authkey(address, give="pass authkey=")
        assert str(refused.value) == f"no authkey: pass authkey= or set {AUTHKEY_ENV}"


# ------------------------------------------------------------------------------ the lock


def test_the_lock_admits_one_holder_and_names_its_pid(own_runtime_dir: Path) -> None:
    directory = open_runtime_dir(create=True)
    assert directory is not None
    assert lock_holder(directory) is None
    fd = take_manager_lock(directory)
    assert fd is not None
    try:
        assert lock_holder(directory) == os.getpid()
        # flock() locks of two opens of one file exclude each other, even in one process.
        assert take_manager_lock(directory) is None
        assert lock_holder(directory) == os.getpid()  # the refused one wrote nothing
        assert stat.S_IMODE((directory / "manager.pid").stat().st_mode) == 0o600
    finally:
        os.close(fd)
    again = take_manager_lock(directory)
    assert again is not None
    os.close(again)


def test_the_lock_of_a_killed_holder_is_free_and_its_pid_replaced(own_runtime_dir: Path) -> None:
    directory = open_runtime_dir(create=True)
    assert directory is not None
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, signal, sys; from pathlib import Path; "
            "from mpsched._transport.runtime import take_manager_lock; "
            "fd = take_manager_lock(Path(sys.argv[1])); print(fd is not None, flush=True); "
            "signal.pause()",
            str(directory),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "True\n"
        assert take_manager_lock(directory) is None
        assert lock_holder(directory) == holder.pid
    finally:
        holder.kill()
        holder.wait(30)
        assert holder.stdout is not None
        holder.stdout.close()
    fd = take_manager_lock(directory)  # SIGKILL closed its descriptor: the lock is free
    assert fd is not None
    os.close(fd)
    assert lock_holder(directory) == os.getpid()
