"""The device side of triggered transfers (:class:`iris.host.triggered.TriggeredPlan`): a kernel publishes a batch
it has written, a copy queue the host prepared moves it to every peer (the copy engine on GPUs: no SM spent), and
a kernel waits for a peer's batch to arrive.

Example:
    >>> @triton.jit
    ... def produce(buffer, gates, arrivals, rank, peer, BLOCK: tl.constexpr):
    ...     b = tl.program_id(0)
    ...     tl.store(buffer + ..., values)               # this rank's batch b
    ...     triggered.publish(gates, rank * BLOCKS + b)   # its copies to every peer start
    ...     triggered.wait_arrival(arrivals, peer * BLOCKS + b)  # the peer's batch b is here
"""

import triton
import triton.language as tl

from iris.device import sync


@triton.jit
def publish(gates, batch):
    """This program's share of batch ``batch`` (its global id) is written; once every contributor the schedule
    names has published (one unless given), the copies queued for it start. The program's earlier stores reach
    memory first (a release at system scope: the copy engine reads them)."""
    tl.debug_barrier()  # every thread's stores of the batch, not only the publishing thread's
    tl.atomic_add(gates + batch, 1, sem="release", scope="sys")


@triton.jit
def wait_arrival(arrivals, batch):
    """Spin until batch ``batch`` (a peer's, by global id) has arrived in this rank's buffer; returns its flag."""
    return sync.wait_until(arrivals + batch, ">=", 1)
