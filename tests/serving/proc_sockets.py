"""Processes and their sockets from Linux ``/proc`` (no psutil): who a job started, where they listen."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

PROC = Path("/proc")


def start_time(pid: int) -> int | None:
    """Clock ticks since boot when ``pid`` started (tells a live process from a reused pid), None if gone."""
    try:
        return int((PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def descendants(root: int) -> dict[int, int]:
    """``{pid: start_time}`` of every live process below ``root`` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = {}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            started = start_time(child)
            if started is not None:
                found[child] = started
                todo.append(child)
    return found


def alive(processes: dict[int, int]) -> list[int]:
    """The pids of ``processes`` (``{pid: start_time}``) still running as the same process."""
    return [pid for pid, started in processes.items() if start_time(pid) == started and not _zombie(pid)]


def _zombie(pid: int) -> bool:
    try:
        return (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _address(hex_address: str) -> str:
    """``0100007F:1F90`` or a 32-digit IPv6 form of /proc/net/tcp* -> the IP address as text."""
    raw = bytes.fromhex(hex_address.split(":")[0])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))  # each 32-bit word in host order
    return str(ipaddress.ip_address(words))


def inet_sockets(pids: list[int]) -> list[tuple[int, str, str, str]]:
    """``(pid, table, local address, state)`` of every TCP/UDP socket ``pids`` hold (state 0A = listening)."""
    tables = {}
    for table in ("tcp", "tcp6", "udp", "udp6"):
        try:
            lines = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            tables[fields[9]] = (table, _address(fields[1]), fields[3])
    found = []
    for pid in pids:
        try:
            links = [os.readlink(fd) for fd in (PROC / str(pid) / "fd").iterdir()]
        except OSError:
            continue
        for link in links:
            inode = link[len("socket:[") : -1] if link.startswith("socket:[") else None
            if inode in tables:
                found.append((pid, *tables[inode]))
    return found


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1 or an IPv4-mapped loopback address (::ffff:127.0.0.1)."""
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback
