"""File descriptors passed among the ranks of one node: each rank listens on an abstract Unix socket, and a round
sends one descriptor (with a small header) from every rank to every other over ``SCM_RIGHTS``.

The virtual-memory heap (:mod:`iris.runtime.vmm`) shares its physical chunks this way. A round is collective:
a rank that never joins leaves the others waiting, so a waiting rank says every minute whom it waits for.

Example:
    >>> exchange = DescriptorExchange(comm, tag="job1_ctx2")      # collective
    >>> got = exchange.round({"lo": 0, "hi": 2 << 20}, fd)       # {peer rank: (header, fd or None)}
    >>> exchange.close()
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time

from iris.runtime.logging import WARNING, log

#: seconds between the messages of a rank still waiting for its peers
PROGRESS_EVERY_S = 60.0
_LENGTH = struct.Struct("!I")


class DescriptorExchange:
    """This rank's end of the exchange among ``comm``'s ranks; ``tag`` names the job and the heap, the same on
    every rank and unique on the node (collective: every rank constructs it)."""

    def __init__(self, comm, tag: str, progress_every_s: float = PROGRESS_EVERY_S):
        self.rank, self.world_size = comm.rank, comm.world_size
        self._tag = tag
        self._progress_every_s = progress_every_s
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self._address(self.rank))
        # a peer is at most one round ahead (it cannot finish a round without this rank's message)
        self._listener.listen(2 * self.world_size + 2)
        self._round = 0
        self._early: dict[int, dict[int, tuple]] = {}  # round -> {rank: (header, fd)} of peers a round ahead
        comm.barrier()  # every listener exists before any rank connects

    def _address(self, rank: int) -> str:
        return f"\0iris_fd_{os.getuid()}_{self._tag}_{rank}"  # abstract: nothing left in the file system

    def round(self, header: dict, fd: int | None, what: str = "a descriptor exchange") -> dict[int, tuple]:
        """Send ``header`` (JSON-able) and ``fd`` (None: none, e.g. the header reports a failure) to every other
        rank, and receive theirs: ``{rank: (header, fd or None)}``; the received descriptors are this process's
        to close. ``what`` names the round in the progress messages."""
        payload = self._next_round(header)
        for peer in range(self.world_size):
            if peer != self.rank:
                self._send(peer, payload, fd)
        return self._collect(what)

    def _next_round(self, header: dict) -> bytes:
        self._round += 1
        return json.dumps({"rank": self.rank, "round": self._round, **header}).encode()

    def _collect(self, what: str) -> dict[int, tuple]:
        received: dict[int, tuple] = self._early.pop(self._round, {})
        started = last_message = time.monotonic()
        self._listener.settimeout(1.0)
        while len(received) < self.world_size - 1:
            try:
                connection, _ = self._listener.accept()
            except socket.timeout:
                now = time.monotonic()
                if now - last_message >= self._progress_every_s:
                    last_message = now
                    missing = [r for r in range(self.world_size) if r != self.rank and r not in received]
                    log(WARNING, f"waited {now - started:.0f} s in {what} for ranks {missing}: every rank must "
                                 "make the same calls in the same order", self.rank, self.world_size)
                continue
            with connection:
                connection.settimeout(None)
                peer_header, peer_fd = self._receive(connection)
            if peer_header["round"] == self._round:
                received[peer_header["rank"]] = (peer_header, peer_fd)
            else:  # a peer already in the next round
                self._early.setdefault(peer_header["round"], {})[peer_header["rank"]] = (peer_header, peer_fd)
        return received

    def _send(self, peer: int, payload: bytes, fd: int | None) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(self._address(peer))
            message = _LENGTH.pack(len(payload)) + payload
            if fd is None:
                sock.sendall(message[:1])
            else:
                socket.send_fds(sock, [message[:1]], [fd])  # the descriptor rides on the first byte
            sock.sendall(message[1:])

    @staticmethod
    def _receive(connection) -> tuple[dict, int | None]:
        first, fds, _, _ = socket.recv_fds(connection, 1, 1)
        data = bytearray(first)
        while True:
            chunk = connection.recv(65536)
            if not chunk:
                break
            data += chunk
        (length,) = _LENGTH.unpack_from(data)
        return json.loads(bytes(data[_LENGTH.size:_LENGTH.size + length])), (fds[0] if fds else None)

    def close(self) -> None:
        self._listener.close()
