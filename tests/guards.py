"""`no_network()`: a block inside which every socket operation made from Python fails and is recorded.

It uses an audit hook (PEP 578: `socket.__new__`, `socket.connect`, `socket.getaddrinfo`, ... events), so
it sees sockets opened by any library that goes through Python's `socket` module, and it fails the test
even when the code under test swallows the error. A hook cannot be removed, so one is installed for the
process and only acts while a block is open.
"""
from __future__ import annotations

import contextlib
import sys

_open_blocks: list[list[str]] = []
_installed = False


def _hook(event: str, args: tuple) -> None:
    if _open_blocks and event.startswith("socket."):
        _open_blocks[-1].append(f"{event}{args!r}")
        raise PermissionError(f"network access inside a no_network() block: {event}")


@contextlib.contextmanager
def no_network():
    """Fails every socket operation inside the block, then asserts that none was attempted."""
    global _installed
    if not _installed:
        sys.addaudithook(_hook)
        _installed = True
    attempts: list[str] = []
    _open_blocks.append(attempts)
    try:
        yield attempts
    finally:
        _open_blocks.pop()
    assert not attempts, f"network access attempted: {attempts[:3]}"
