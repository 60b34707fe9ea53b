"""Versions: the check that a peer runs the manager's Python and cloudpickle."""

from __future__ import annotations

import logging

from mpsched._errors import VersionMismatchError
from mpsched._transport.sockets import describe_versions

log = logging.getLogger("mpsched.manager")


class Versions:
    """This manager's Python and cloudpickle versions; refuses a peer whose differ."""

    def __init__(self) -> None:
        self.ours = describe_versions()

    def check(self, peer: str, theirs: tuple[str, str]) -> None:
        """Refuse ``peer`` (a worker or a client, in words) unless ``theirs`` are ours.

        Raises:
            VersionMismatchError: they differ (logged once as a warning).
        """
        if theirs != self.ours:
            error = VersionMismatchError(peer, self.ours, theirs)
            log.warning("refused %s", error)
            raise error
