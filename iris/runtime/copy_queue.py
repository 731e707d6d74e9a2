"""Copy queues: copies and flag operations queued beside the kernels, in order, each waiting for the one before.

What a triggered transfer (:mod:`iris.host.triggered`) is queued on. ``wait_value`` holds the queue until a word
reaches a value (a kernel publishes it), ``copy`` moves bytes, ``write_value`` stores a word. On a GPU the queue
is a stream of its own, its waits the driver's stream memory operations (cuStreamWaitValue64 /
hipStreamWaitValue64) and its copies the copy engine's, so no SM is spent; on the CPU backend it is a thread of
the rank's process that polls the word and copies with memmove.

Example:
    >>> queue = backend.copy_queue(device)
    >>> queue.fork()                                  # after the work queued so far on the current stream
    >>> queue.wait_value(gate_address, 1)             # until a kernel sets the gate
    >>> queue.copy(peer_address, local_address, nbytes)
    >>> queue.write_value(gate_address, 0)
    >>> launch_the_kernel(); queue.join(timeout=60)   # the current stream continues after the queue
"""

from __future__ import annotations

import collections
import ctypes
import threading
import time

import torch


class CopyQueue:
    """The interface; :meth:`iris.runtime.Backend.copy_queue` gives the backend's."""

    def fork(self) -> None:
        """Later operations start after the work queued so far on the current stream."""
        raise NotImplementedError

    def wait_value(self, address: int, value: int) -> None:
        """Later operations wait until the int64 at ``address`` is at least ``value``."""
        raise NotImplementedError

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        """Copy ``nbytes`` from ``src`` to ``dst`` (addresses mapped in this process)."""
        raise NotImplementedError

    def write_value(self, address: int, value: int) -> None:
        """Store ``value`` in the int64 at ``address`` (this rank's memory)."""
        raise NotImplementedError

    def join(self, timeout: float) -> None:
        """Work queued later on the current stream starts after every operation of this queue; where the host
        waits for that (the CPU backend), TimeoutError after ``timeout`` seconds naming the operation it is stuck on."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop taking operations (a thread of its own ends)."""


class StreamCopyQueue(CopyQueue):
    """A GPU stream of its own; ``runtime`` an :class:`iris.runtime.ipc.GpuRuntime`.

    Its operations reach the driver at :meth:`join`, not as they are queued: a stream wait for a word that a
    kernel sets must be submitted after that kernel's launch (CUDA does not see the dependency; submitted first,
    where the two streams share a hardware queue, the wait holds the kernel back for ever)."""

    def __init__(self, runtime, device):
        self._runtime, self._device = runtime, device
        self.stream = torch.cuda.Stream(device)
        self._held: list = []  # calls of a stream handle, submitted at join

    def fork(self):
        self.stream.wait_stream(torch.cuda.current_stream(self._device))  # an event recorded now: safe at once

    def wait_value(self, address, value):
        self._held.append(lambda stream: self._runtime.wait_value(stream, address, value))

    def copy(self, dst, src, nbytes):
        self._held.append(lambda stream: self._runtime.memcpy_async(dst, src, nbytes, stream))

    def write_value(self, address, value):
        self._held.append(lambda stream: self._runtime.write_value(stream, address, value))

    def join(self, timeout):
        held, self._held = self._held, []
        for submit in held:
            submit(self.stream.cuda_stream)
        torch.cuda.current_stream(self._device).wait_stream(self.stream)


class ThreadCopyQueue(CopyQueue):
    """A thread of this process running the operations in order as they are queued (the CPU backend's kernels run
    on the host, so the queue must run beside them: a kernel may publish one block and wait for a peer's)."""

    POLL_S = 50e-6  # how long the thread sleeps between two reads of an awaited word (it lets the kernels run)

    def __init__(self):
        self._operations: collections.deque = collections.deque()
        self._changed = threading.Condition()
        self._current = None  # the operation running, for join's message
        self._error: BaseException | None = None
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="iris-copy-queue", daemon=True)
        self._thread.start()

    def fork(self):
        pass  # the CPU backend's kernels have run by the time they return

    def _put(self, operation):
        with self._changed:
            if self._stopped:
                raise RuntimeError("this copy queue gave up (a join timed out or it was closed); make another")
            self._operations.append(operation)
            self._changed.notify_all()

    def wait_value(self, address, value):
        self._put(("wait_value", address, value))

    def copy(self, dst, src, nbytes):
        self._put(("copy", dst, src, nbytes))

    def write_value(self, address, value):
        self._put(("write_value", address, value))

    def _run(self):
        while True:
            with self._changed:
                while not self._operations and not self._stopped:
                    self._changed.wait()
                if self._stopped:
                    return
                self._current = operation = self._operations[0]
            try:
                self._execute(operation)
            except BaseException as error:  # told at join
                with self._changed:
                    self._error = error
            with self._changed:
                if self._stopped:
                    return
                self._operations.popleft()
                self._current = None
                self._changed.notify_all()

    def _execute(self, operation):
        kind = operation[0]
        if kind == "wait_value":
            word = ctypes.c_int64.from_address(operation[1])
            while word.value < operation[2] and not self._stopped:
                time.sleep(self.POLL_S)
        elif kind == "copy":
            ctypes.memmove(operation[1], operation[2], operation[3])
        else:
            ctypes.c_int64.from_address(operation[1]).value = operation[2]

    def join(self, timeout):
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._operations:
                left = deadline - time.monotonic()
                if left <= 0:
                    stuck = self._current or self._operations[0]
                    self._operations.clear()  # what is left is dropped: the queue is free for the next round
                    self._stopped = True
                    self._changed.notify_all()
                    raise TimeoutError(f"the copy queue did not finish within {timeout:g} s: it was at "
                                       f"{describe(stuck)}")
                self._changed.wait(min(left, 0.1))
            error, self._error = self._error, None
        if error is not None:
            raise RuntimeError(f"the copy queue failed: {error}") from error

    def close(self):
        with self._changed:
            self._stopped = True
            self._changed.notify_all()


def describe(operation) -> str:
    """An operation as a message names it, e.g. ``wait_value(0x7f00c0, >= 1)``."""
    kind, *rest = operation
    if kind == "wait_value":
        return f"wait_value({hex(rest[0])}, >= {rest[1]})"
    if kind == "copy":
        return f"copy({hex(rest[0])} <- {hex(rest[1])}, {rest[2]} bytes)"
    return f"write_value({hex(rest[0])}, {rest[1]})"
