"""The status page in a real browser: Debian's chromium, driven by Playwright (which never
downloads a browser of its own here). The page loads, shows what the manager holds, keeps
itself up to date, and, with a token, acts."""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError
from pathlib import Path
from typing import Any

import jobs
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, expect, sync_playwright
from processes import wait_started

import mpsched._manager.http
from mpsched import Priority, Scheduler

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WAIT_MS = 30_000  # for the page to show a change, on a loaded 2-core machine
TOKEN = "page-token-for-tests"
SCREENSHOT_ENV = "MPSCHED_SCREENSHOT"  # where to copy the screenshot (make screenshot)
README_SCREENSHOT = Path(__file__).parent.parent / "docs" / "dashboard.png"
PAGE_KEY = b"mpsched-page"  # the PNG text chunk that says which page.html it shows

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert os.path.exists(CHROMIUM), f"{CHROMIUM} is missing: make tools installs it (apt-get)"
    expect.set_options(timeout=WAIT_MS)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def open_page(browser: Browser) -> Iterator[Callable[[str], tuple[Page, list[str]]]]:
    """Open a URL in a fresh page; returns it and the console errors it logs (and errors
    its scripts throw), as they come."""
    pages: list[Page] = []

    def open_(url: str) -> tuple[Page, list[str]]:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        pages.append(page)
        errors: list[str] = []

        def on_console(message: ConsoleMessage) -> None:
            if message.type == "error":
                errors.append(message.text)

        page.on("console", on_console)
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(url)
        return page, errors

    yield open_
    for page in pages:
        page.close()


def number(page: Page, selector: str) -> int:
    return int(page.locator(selector).inner_text().replace(",", ""))


def test_the_page_shows_workers_and_jobs_and_follows_a_job_to_its_end(
    make_scheduler: Callable[..., Scheduler], open_page: Any, fifo: str, tmp_path: Path
) -> None:
    s = make_scheduler(workers=2, http="127.0.0.1:0")
    assert s.http_url is not None and s.http_url.startswith("http://127.0.0.1:")
    for f in [s.submit(jobs.noop, i) for i in range(40)]:
        f.result()
    failed = s.submit(jobs.fail, "the page shows this")
    with pytest.raises(ValueError):
        failed.result()
    release = tmp_path / "release"
    running = s.submit(jobs.announce_then_wait, fifo, str(release), 60.0)
    wait_started(fifo)
    later = [
        s.schedule(jobs.noop, delay=3600 + i, priority=p)
        for i, p in enumerate((Priority.HIGH, Priority.MEDIUM, Priority.LOW) * 3)
    ]
    tick = s.every(3600, jobs.noop, id="hourly-refresh")
    pids = {w.pid for w in s.stats().workers}

    page, errors = open_page(s.http_url)
    workers = page.locator("#workers tbody tr[data-pid]")
    expect(workers).to_have_count(2)
    assert {
        int(pid) for pid in workers.evaluate_all("rows => rows.map(r => r.dataset.pid)")
    } == pids
    for pid in pids:
        expect(page.locator("#workers")).to_contain_text(str(pid))
    expect(page.locator(f'#pending tr[data-job-id="{later[0].job_id}"]')).to_be_visible()
    expect(page.locator(f'#running tr[data-job-id="{running.job_id}"]')).to_be_visible()
    expect(page.locator(f'#failures details[data-job-id="{failed.job_id}"]')).to_contain_text(
        "ValueError: the page shows this"
    )
    expect(page.locator('#schedules tr[data-schedule-id="hourly-refresh"]')).to_be_visible()
    expect(page.locator("#count-high")).to_have_text("3")
    done = number(page, "#count-done")
    failure = page.locator(f'#failures details[data-job-id="{failed.job_id}"]')
    failure.locator("summary").click()
    expect(failure.locator("pre")).to_contain_text("in fail\n    raise ValueError(message)")
    updated = page.locator("#live").inner_text()
    expect(page.locator("#live")).not_to_have_text(updated)  # the page polled again...
    expect(failure).to_have_attribute("open", "")  # ... and the traceback stays open

    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get(SCREENSHOT_ENV):
        Path(os.environ[SCREENSHOT_ENV]).write_bytes(
            with_text(shot.read_bytes(), PAGE_KEY, page_digest())
        )

    release.touch()
    assert running.result(timeout=30) == "woke"
    expect(page.locator(f'#running tr[data-job-id="{running.job_id}"]')).to_have_count(0)
    expect(page.locator("#count-done")).to_have_text(str(done + 1))
    expect(page.locator("#live")).to_have_class("fact up")
    assert errors == []
    tick.cancel()
    for f in later:
        f.cancel()


@pytest.fixture
def with_token(make_scheduler: Callable[..., Scheduler], tmp_path: Path) -> Scheduler:
    """A Scheduler whose page needs TOKEN."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    s = make_scheduler(workers=1, http="127.0.0.1:0", http_token_file=token_file)
    assert s.http_url is not None
    return s


def test_with_the_token_in_its_address_the_page_cancels_jobs_and_pauses_schedules(
    with_token: Scheduler, open_page: Any
) -> None:
    s = with_token
    later = s.schedule(jobs.noop, delay=3600)
    tick = s.every(3600, jobs.noop, id="tick")

    assert s.http_url is not None
    page, errors = open_page(s.http_url + "#token=" + TOKEN)
    assert "token" not in page.url  # out of the address bar (and history) at once
    page.locator(f'#pending tr[data-job-id="{later.job_id}"] button').click()
    expect(page.locator("#note")).to_have_text("cancel: done")
    with pytest.raises(CancelledError):  # its own client hears of it
        later.result(timeout=30)
    page.locator('#schedules tr[data-schedule-id="tick"] button').click()
    expect(page.locator('#schedules tr[data-schedule-id="tick"] button')).to_have_text("resume")
    assert tick.info().paused
    assert errors == []
    tick.cancel()


def test_without_the_token_the_page_asks_for_it(with_token: Scheduler, open_page: Any) -> None:
    assert with_token.http_url is not None
    page, _ = open_page(with_token.http_url)
    expect(page.locator("#auth")).to_be_visible()
    expect(page.locator("#live")).to_have_text("needs a token")
    page.locator("#token").fill(TOKEN)
    page.locator("#auth button").click()
    expect(page.locator("#auth")).to_be_hidden()
    expect(page.locator("#live")).to_contain_text("actions on")


def page_digest() -> bytes:
    """What identifies this version of the page: its file's SHA-256, in short."""
    html = Path(mpsched._manager.http.__file__).with_name("page.html").read_bytes()
    return hashlib.sha256(html).hexdigest()[:16].encode()


def with_text(png: bytes, key: bytes, value: bytes) -> bytes:
    """``png`` with a tEXt chunk ``key``: ``value`` before its end (IEND, 12 bytes)."""
    data = key + b"\0" + value
    chunk = (
        struct.pack(">I", len(data))
        + b"tEXt"
        + data
        + struct.pack(">I", zlib.crc32(b"tEXt" + data))
    )
    return png[:-12] + chunk + png[-12:]


def text_of(png: bytes, key: bytes) -> bytes | None:
    """The value of the tEXt chunk ``key`` of ``png``; None without one."""
    at = 8  # past the signature
    while at < len(png):
        (length,), kind = struct.unpack(">I", png[at : at + 4]), png[at + 4 : at + 8]
        data = png[at + 8 : at + 8 + length]
        if kind == b"tEXt" and data.partition(b"\0")[0] == key:
            return data.partition(b"\0")[2]
        at += 12 + length
    return None


def test_the_readme_screenshot_shows_this_page() -> None:
    """The README's screenshot is taken by the browser test above (make screenshot), which
    writes in it which page.html it shows: a change to the page needs a new one."""
    shown = text_of(README_SCREENSHOT.read_bytes(), PAGE_KEY)
    assert shown == page_digest(), (
        f"{README_SCREENSHOT} shows another page.html than this one ({shown!r}): run make "
        f"screenshot and commit it"
    )
