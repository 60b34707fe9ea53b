"""``serve --http``: the page and metrics of a real serve process, and the rules that
refuse to start one."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from served import Processes, serve

from mpsched._cli.main import main
from mpsched._protocol.records import Exit

TOKEN = "a-token-for-the-page"


def token_file(tmp_path: Path, mode: int = 0o600) -> Path:
    path = tmp_path / "http-token"
    path.write_text(TOKEN + "\n")
    path.chmod(mode)
    return path


def test_serve_refuses_a_non_loopback_page_without_a_token_and_tls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--http", "0.0.0.0:0"]) == Exit.UNSAFE
    assert capsys.readouterr().err == (
        "mpsched: refusing to serve the status page on 0.0.0.0:0 without a token file "
        "(--http-token-file) and TLS (--tls-cert, --tls-key): anyone who can connect to it "
        "could read the scheduler's jobs. Give both, or a loopback address (--http PORT "
        "serves 127.0.0.1:PORT).\n"
    )
    assert (
        main(["serve", "--http", "0.0.0.0:0", "--http-token-file", str(token_file(tmp_path))])
        == Exit.UNSAFE
    )
    assert "without TLS (--tls-cert, --tls-key): " in capsys.readouterr().err


@pytest.mark.parametrize("address", [":8080", "10.0.0.1", "unix:/tmp/page.sock", "8o80"])
def test_serve_says_what_an_http_address_may_be(
    address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--http", address]) == Exit.USAGE
    assert (
        f"bad HTTP address {address!r}: use a port (0 to 65535; on 127.0.0.1, this "
        f"machine only) or HOST:PORT" in capsys.readouterr().err
    )


def test_serve_refuses_a_token_file_others_can_read_or_without_http(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "serve",
                "--http",
                "127.0.0.1:0",
                "--http-token-file",
                str(token_file(tmp_path, 0o644)),
            ]
        )
        == Exit.AUTH
    )
    assert "readable by others" in capsys.readouterr().err
    assert main(["serve", "--http-token-file", str(token_file(tmp_path))]) == Exit.USAGE
    assert "--http-token-file goes with --http" in capsys.readouterr().err


def get(url: str, token: str | None = None) -> tuple[int, str]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=10
        ) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.mark.slow
def test_serve_prints_where_its_page_is_and_serves_it_with_the_token(
    procs: Processes, tmp_path: Path
) -> None:
    manager = serve(
        procs,
        "--address",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--http",
        "127.0.0.1:0",
        "--http-token-file",
        str(token_file(tmp_path)),
    )
    lines = [manager.proc.line() for _ in range(3)]  # status, store, page
    page = re.search(r"page:\s+(http://127\.0\.0\.1:\d+/)#token=TOKEN", lines[2])
    assert page, lines
    url = page.group(1)
    status, metrics = get(url + "metrics", TOKEN)
    assert status == 200 and 'mpsched_workers{state="idle"' in metrics
    assert get(url + "metrics", "wrong")[0] == 401
    assert get(url + "api/status")[0] == 401
    status, html = get(url)  # the page's code, which holds no data
    assert status == 200 and "<title>mpsched</title>" in html
