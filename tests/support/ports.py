"""Ports for servers a test kills and starts again: free, and below the kernel's ephemeral range.

A port the OS hands out for binding port 0 lies in the ephemeral range, where outgoing
connections take their source ports. While a killed server is down, two things can then go
wrong that have nothing to do with the code under test:

- an outgoing connection takes the port, and the server cannot bind it again on restart;
- a client reconnecting to the dead port is connected to itself (a TCP self-connect: Linux
  picks the very port it dials as the source), and reads its own command back as the reply.

Below the range neither can happen; `bus_offset` keeps a second port (a Redis Cluster node's
bus, +10000) free and below it too.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_LOWEST = 10000


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default when it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def restartable_ports(count: int, *, bus_offset: int = 0) -> list[int]:
    """`count` distinct free ports (and each `port + bus_offset`), all below the ephemeral range."""
    high = ephemeral_low() - bus_offset - 1
    if high - _LOWEST < 1000:
        raise RuntimeError(f"too few ports below the ephemeral range ({ephemeral_low()}) for a restartable server")
    ports: list[int] = []
    while len(ports) < count:
        port = random.randint(_LOWEST, high)
        taken = {*ports, *(p + bus_offset for p in ports)}
        if port in taken or port + bus_offset in taken:
            continue
        if _free(port) and (bus_offset == 0 or _free(port + bus_offset)):
            ports.append(port)
    return ports


def restartable_port() -> int:
    """One port of `restartable_ports`."""
    (port,) = restartable_ports(1)
    return port


__all__ = ["ephemeral_low", "restartable_port", "restartable_ports"]
