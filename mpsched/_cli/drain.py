"""``python -m mpsched drain-workers``: every remote worker pool connected to a manager
leaves. Each pool's workers finish their running jobs, report them and exit; the pool
exits 0. The manager keeps running, and a pool started later joins it as usual."""

from __future__ import annotations

import argparse
from typing import TextIO

from mpsched._cli.connection import manager_of, service_at
from mpsched._cli.formats import plural
from mpsched._protocol.records import LONG_POLL, Exit
from mpsched._transport.address import format_address


def run_drain_workers(args: argparse.Namespace, out: TextIO) -> int:
    """The ``drain-workers`` command: dismiss the manager's remote workers."""
    address, key = manager_of(args)
    dismissed = service_at(address, key).drain_workers()
    where = format_address(address)
    if not dismissed:
        print(f"no remote worker is connected to the manager at {where}", file=out)
    else:
        print(
            f"told {plural(dismissed, 'remote worker')} of the manager at {where} to "
            f"leave: each finishes its running job and exits (an idle one within "
            f"{LONG_POLL:g} s), and so do their pools",
            file=out,
        )
    return Exit.OK
