"""Triggered transfers: a kernel publishes a block it wrote, and a copy queue the host prepared moves it to every
peer, leaving every SM to the kernel (on GPUs the copy engine moves the bytes; a stream of its own waits on the
block's gate with the driver's stream memory operations).

Each rank owns batches of a symmetric ``buffer`` (element ranges, ``schedules[rank]``); when a kernel publishes
one (:func:`iris.device.triggered.publish`), its bytes go to the same range of every peer's ``buffer``, then the
batch's arrival flag is set there (:func:`iris.device.triggered.wait_arrival` waits for it). Batch ids are global:
rank r's come after those of ranks 0..r-1 (:meth:`TriggeredPlan.batch`).

Example:
    >>> blocks, block = 8, 4096
    >>> buffer = ctx.zeros(world * blocks * block)              # every rank's slot, gathered on every rank
    >>> schedules = [[(r * blocks * block + b * block, r * blocks * block + (b + 1) * block) for b in range(blocks)]
    ...              for r in range(world)]
    >>> plan = TriggeredPlan(ctx, buffer, schedules)           # collective
    >>> plan.start()                                           # the copies queued, each waiting for its batch
    >>> produce[(blocks,)](buffer, plan.gates, plan.arrivals, rank, ...)  # publish(gates, plan.batch(rank, b))
    >>> plan.finish()                                          # every batch sent and arrived; ready for the next
"""

from __future__ import annotations

import torch

from iris.runtime.copy_queue import CopyQueue


class TriggeredPlan:
    """Copies of ``buffer``'s batches to every peer, each started by a kernel (see the module).

    Args:
        ctx: the Iris context.
        buffer: a contiguous tensor on the symmetric heap.
        schedules: one list per rank of ``(start, stop)`` element ranges of ``buffer`` (or ``(start, stop,
            contributors)``: the batch goes once that many programs have published it, e.g. the tiles of a row
            block), in the order that rank publishes them; no two batches overlap. Every rank passes the same.
        timeout: seconds :meth:`finish` waits for this rank's copies where the host waits (the CPU backend).

    Raises (collective, before any copy): ValueError for a buffer off the heap or not contiguous, a range outside
    it, overlapping batches, schedules that are not one per rank, or ranks that passed different ones.
    """

    def __init__(self, ctx, buffer: torch.Tensor, schedules, timeout: float = 60.0):
        self._ctx = ctx
        self.rank, self.world = ctx.get_rank(), ctx.get_num_ranks()
        self.timeout = timeout
        refusal = _refusal(ctx, buffer, schedules, self.world)
        team = ctx.team
        self._heap = heap = team.heap
        if refusal is None and not heap.maps():
            refusal = "a member's heap is reached only through the engine (another node): no copy can reach it"
        schedules = [] if refusal else [[(int(entry[0]), int(entry[1]), int(entry[2]) if len(entry) == 3 else 1)
                                         for entry in own] for own in schedules]
        self.first = [0]
        for own in schedules:
            self.first.append(self.first[-1] + len(own))
        count = self.first[-1] if schedules else 0
        self.gates = ctx.zeros(max(count, 1), dtype=torch.int64)  # this rank's batches: contributors so far
        self.arrivals = ctx.zeros(max(count, 1), dtype=torch.int64)  # every batch: here when 1
        self._one = ctx.ones(1, dtype=torch.int64)  # what the copies of arrival flags read
        start = heap.base
        described = (refusal, buffer.numel() if isinstance(buffer, torch.Tensor) else None, str(
            getattr(buffer, "dtype", None)), schedules, [t.data_ptr() - start for t in (self.gates, self.arrivals)])
        everyone = team.comm.all_gather_object(described)
        failed = [(r, d[0]) for r, d in enumerate(everyone) if d[0]]
        if failed:
            raise ValueError("TriggeredPlan: " + "; ".join(f"rank {r}: {why}" for r, why in failed))
        differing = [r for r, d in enumerate(everyone) if d[1:] != everyone[0][1:]]
        if differing:
            raise ValueError(f"TriggeredPlan: ranks {differing} passed another buffer size, dtype or schedules than "
                             "rank 0 (every rank passes the same, in the same order of plans)")
        self.buffer, self.schedules = buffer, schedules
        self._queue: CopyQueue | None = ctx.backend.copy_queue(buffer.device)
        self._started = False
        self.rounds = 0  # rounds finished
        ctx.barrier()

    def batch(self, rank: int, index: int) -> int:
        """The global id of ``schedules[rank][index]``: what a kernel passes to publish and wait_arrival."""
        return self.first[rank] + index

    def start(self) -> None:
        """Begin a round: a device barrier (every rank is done with the last round's data), then, queued, for each
        of this rank's batches in order: wait for its gate, send its bytes to every peer (the next rank first)
        followed by the batch's arrival flag there, close the gate. Call before launching the kernels that
        publish; then :meth:`finish`."""
        self._heap.refuse_if_closed("TriggeredPlan.start")
        if self._queue is None:
            raise RuntimeError("TriggeredPlan.start: this plan is closed")
        if self._started:
            raise RuntimeError("TriggeredPlan.start: the round already started; call finish() first")
        queue, size = self._queue, self.buffer.element_size()
        # every rank has started this round (so it is done with the last one's data) before any copy can land
        self._ctx.device_barrier()
        queue.fork()
        for index, (lo, hi, contributors) in enumerate(self.schedules[self.rank]):
            batch = self.batch(self.rank, index)
            gate = self.gates.data_ptr() + batch * 8
            queue.wait_value(gate, contributors)
            for step in range(1, self.world):
                peer = (self.rank + step) % self.world
                source = self.buffer.data_ptr() + lo * size
                queue.copy(self._heap.peer_address(source, peer), source, (hi - lo) * size)
                queue.copy(self._heap.peer_address(self.arrivals.data_ptr() + batch * 8, peer), self._one.data_ptr(), 8)
            queue.write_value(gate, 0)
        self._started = True

    def finish(self) -> None:
        """End the round: work queued later on the current stream waits for this rank's copies (on the CPU
        backend the host waits, TimeoutError after ``timeout`` naming what was never published), then a device
        barrier (every rank's copies landed: ``buffer`` is whole here), then the arrival flags are cleared."""
        if not self._started:
            raise RuntimeError("TriggeredPlan.finish: no round started (call start() first)")
        self._started = False
        self._queue.join(self.timeout)
        self._ctx.device_barrier()  # every rank's copies have landed, here too
        self.arrivals.zero_()  # before this rank's next start: no peer's next copy lands before that barrier
        self.rounds += 1

    def around(self, launch) -> TriggeredLaunch:
        """``launch`` (a kernel launch that publishes this plan's batches) as one callable: start, launch, finish;
        what a fused op remembers and replays."""
        return TriggeredLaunch(self, launch)

    def close(self) -> None:
        """Stop the copy queue (its thread on the CPU backend); the plan cannot start again. A plan no longer
        referenced closes itself (a fused op's plan dropped with its remembered call)."""
        queue, self._queue = getattr(self, "_queue", None), None
        if queue is not None:
            queue.close()

    def __del__(self):
        self.close()


def _refusal(ctx, buffer, schedules, world: int) -> str | None:
    """Why this rank cannot make the plan, or None."""
    if not isinstance(buffer, torch.Tensor):
        return f"buffer must be a torch.Tensor on the symmetric heap, got {type(buffer).__name__}"
    if not ctx.is_symmetric(buffer) or not buffer.is_contiguous():
        return "buffer must be a contiguous tensor on the symmetric heap (ctx.zeros(...), ctx.empty(...))"
    if not isinstance(schedules, (list, tuple)) or len(schedules) != world:
        return f"schedules must hold one list of (start, stop) ranges per rank ({world})"
    ranges = []
    for rank, own in enumerate(schedules):
        for entry in own:
            if (not isinstance(entry, (list, tuple)) or len(entry) not in (2, 3)
                    or not all(isinstance(v, int) and not isinstance(v, bool) for v in entry)):
                return (f"rank {rank}'s batch {entry!r} is not (start, stop) element indices, or (start, stop, "
                        "contributors)")
            if len(entry) == 3 and entry[2] < 1:
                return f"rank {rank}'s batch {entry!r} names {entry[2]} contributors; at least one publishes it"
            lo, hi = entry[:2]
            if not 0 <= lo < hi <= buffer.numel():
                return f"rank {rank}'s batch ({lo}, {hi}) is not a non-empty range of the {buffer.numel()} elements"
            ranges.append((lo, hi, rank))
    if not ranges:
        return "the schedules hold no batch"
    ranges.sort()
    for (lo, hi, rank), (next_lo, next_hi, other) in zip(ranges, ranges[1:]):
        if next_lo < hi:
            return (f"rank {rank}'s batch ({lo}, {hi}) overlaps rank {other}'s ({next_lo}, {next_hi}): their copies "
                    "would overwrite each other")
    return None


class TriggeredLaunch:
    """A round of a :class:`TriggeredPlan` around one kernel launch: ``plan.start(); launch(); plan.finish()``.
    ``tensors`` are the launch's (what a remembered call must keep alive to replay)."""

    def __init__(self, plan: TriggeredPlan, launch):
        self.plan, self.launch = plan, launch
        self.tensors = getattr(launch, "tensors", ())

    def __call__(self) -> None:
        self.plan.start()
        self.launch()
        self.plan.finish()
