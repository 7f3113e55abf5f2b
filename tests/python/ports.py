"""A TCP port for a test's own rendezvous (torch's env:// MASTER_PORT).

The port is released before the ranks bind it, so it is chosen *below* the
kernel's ephemeral range: a port from bind(("", 0)) lies inside that range,
where any outgoing connection on the machine (a DDP test running beside this
one opens hundreds) may take it first, and torch's store then fails with
"Address already in use". Only an explicit bind takes a port outside the
range. Where 64 random ports below it are all taken, it falls back to bind(0),
with the race above.
"""
import random
import socket

_LOWEST = 10000


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _can_bind(addr, port):
    """On addr ("" is every address: torch's store binds the wildcard)."""
    with socket.socket() as s:
        try:
            s.bind((addr, port))
        except OSError:
            return False
        return True


def free_port():
    low = _ephemeral_low()
    rng = random.SystemRandom()
    if low - _LOWEST >= 1000:
        for _ in range(64):
            port = rng.randrange(_LOWEST, low)
            if _can_bind("127.0.0.1", port) and _can_bind("", port):
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
