"""Tracing, host side: ``ctx.tracing.enable()``, run kernels built with tracing, ``ctx.tracing.export()``.

Kernels record through a :class:`iris.DeviceContext` made with ``tracing=True``: every device op and your
own spans (see :mod:`iris.device.tracing`). :meth:`Tracing.export` writes Chrome trace JSON (open it at
https://ui.perfetto.dev): a process per rank, a track per SM/CU, and flow arrows from signals to waits.

Example:
    >>> ctx.tracing.enable(max_events=100_000)
    >>> kernel[grid](ctx.get_device_context(), ..., rank=ctx.get_rank(), world_size=ctx.get_num_ranks())
    >>> ctx.tracing.export("trace.json", merge=True)   # trace_rank<r>.json on each rank, trace.json on rank 0
"""

from __future__ import annotations

import json
import weakref

import torch

from iris.device.tracing import EVENT_NAMES, FIELDS, HEADER, header_slot
from iris.runtime.logging import INFO, log

_DATA_MOVERS = ("put", "store", "copy")


class Tracing:
    """Device-side event tracing of one Iris context (``ctx.tracing``)."""

    def __init__(self, ctx):
        self._ctx = weakref.proxy(ctx)
        self.enabled = False
        self.max_events = 0
        self._records: torch.Tensor | None = None
        self._counters: torch.Tensor | None = None

    def enable(self, max_events: int = 1_000_000) -> None:
        """Allocate room for ``max_events`` events and let traced kernels record (later events are dropped).

        Example:
            >>> ctx.tracing.enable(max_events=10_000)
        """
        if not isinstance(max_events, int) or isinstance(max_events, bool) or max_events < 1:
            raise ValueError(f"tracing.enable: max_events={max_events!r} must be a positive int")
        device = self._ctx.get_device()
        self._records = torch.zeros(len(FIELDS), max_events, dtype=torch.int64, device=device)
        self._counters = torch.zeros(2, dtype=torch.int32, device=device)  # events, ops
        self.max_events = max_events
        self.enabled = True
        self._write_header()
        log(INFO, f"device tracing on: up to {max_events} events", self._ctx.get_rank(), self._ctx.get_num_ranks())

    def disable(self) -> None:
        """Stop recording (the events so far stay readable until :meth:`enable` again)."""
        self.enabled = False
        self._write_header()

    def reset(self) -> None:
        """Forget the events recorded so far (the buffers stay)."""
        if self._counters is not None:
            self._counters.zero_()

    def _write_header(self) -> None:
        header = torch.zeros(HEADER + len(FIELDS), dtype=torch.int64)
        if self.enabled:
            row_bytes = self.max_events * 8
            header[:HEADER] = torch.tensor([1, self.max_events, self._counters.data_ptr(),
                                            self._counters.data_ptr() + 4])
            header[HEADER:] = torch.tensor([self._records.data_ptr() + f * row_bytes for f in range(len(FIELDS))])
        start = header_slot(self._ctx.get_num_ranks())
        self._ctx.get_device_context()[start:start + len(header)].copy_(header)  # in place: heap_bases views it

    def events(self) -> list[dict]:
        """This rank's events in order: dicts of :data:`iris.device.tracing.FIELDS`, ``name`` and heap ``offset``."""
        if self._records is None:
            return []
        self._ctx.team.backend.synchronize(self._ctx.get_device())
        count = min(int(self._counters[0].item()), self.max_events)
        columns = self._records[:, :count].cpu().tolist()
        heap = self._ctx.heap
        found = []
        for i in range(count):
            event = {name: columns[f][i] for f, name in enumerate(FIELDS)}
            event["name"] = EVENT_NAMES.get(event["event_id"], f"event_{event['event_id']}")
            offset = event["address"] - heap.base
            event["offset"] = offset if 0 <= offset < heap.size + heap.reserved else None
            found.append(event)
        return found

    def export(self, filename: str = "trace.json", merge: bool = False) -> dict:
        """Write this rank's events to ``<filename minus .json>_rank<r>.json``; with ``merge`` (collective),
        also every rank's to ``filename`` on rank 0.

        Returns:
            The merged trace (every rank) with ``merge``, else this rank's, as written (Chrome trace JSON).
        """
        rank = self._ctx.get_rank()
        mine = self.events()
        per_rank = _chrome_trace([(rank, mine)], self._ctx.get_num_ranks(), self._ctx.team.backend)
        with open(filename.removesuffix(".json") + f"_rank{rank}.json", "w") as file:
            json.dump(per_rank, file)
        if not merge:
            return per_rank
        everyone = self._ctx.comm.all_gather_object(mine)
        merged = _chrome_trace(list(enumerate(everyone)), self._ctx.get_num_ranks(), self._ctx.team.backend)
        if rank == 0:
            with open(filename, "w") as file:
                json.dump(merged, file)
        return merged

    def summary(self) -> dict:
        """Where this rank's traced time went: :func:`summarize` of :meth:`events`.

        Example:
            >>> ctx.tracing.enable(); ctx.tracing.reset()
            >>> ctx.ops.matmul_all_reduce(out, A, B)
            >>> ctx.tracing.summary()["kinds"]["compute"]["per_program_us"]
        """
        return summarize(self.events())


def summarize(events: list[dict]) -> dict:
    """Where the time of a traced run went, per kind of span (``compute``, ``put``, ``reduce``, ``wait``, ...).

    Returns a dict: ``span_us`` (first start to last end), ``programs``, ``kinds`` ({name: {"count",
    "mean_us", "per_program_us"}}), ``idle_us`` (per program, the time no span covers) and ``tail_us``
    (after the last ``compute`` span). On the CPU backend only the counts mean anything.

    Example:
        >>> summarize(ctx.tracing.events())["tail_us"]
    """
    if not events:
        return {"span_us": 0.0, "programs": 0, "tail_us": 0.0, "idle_us": 0.0, "kinds": {}}
    start = min(e["timestamp"] for e in events)
    stop = max(max(e["end"], e["timestamp"]) for e in events)
    programs = sorted({e["pid"] for e in events})
    spans = [e for e in events if e["end"] > 0]
    kinds, covered = {}, 0
    for name in sorted({e["name"] for e in spans}):
        lengths = [e["end"] - e["timestamp"] for e in spans if e["name"] == name]
        kinds[name] = {"count": len(lengths), "mean_us": sum(lengths) / len(lengths) / 1000,
                       "per_program_us": sum(lengths) / len(programs) / 1000}
    for pid in programs:
        reach = start
        for e in sorted((e for e in spans if e["pid"] == pid), key=lambda e: e["timestamp"]):
            covered += max(e["end"] - max(e["timestamp"], reach), 0)
            reach = max(reach, e["end"])
    computes = [e["end"] for e in spans if e["name"] == "compute"]
    return {"span_us": (stop - start) / 1000, "programs": len(programs),
            "tail_us": (stop - max(computes)) / 1000 if computes else 0.0,
            "idle_us": (stop - start) / 1000 - covered / len(programs) / 1000, "kinds": kinds}


def _track(event: dict, by_program: bool) -> str:
    return f"program {event['pid']}" if by_program else f"SM/CU {event['cu_id']} (XCC {event['xcc_id']})"


def _chrome_trace(ranks: list[tuple[int, list[dict]]], world_size: int, backend) -> dict:
    """Chrome trace JSON of ``ranks``' events; tracks are programs where programs run in turn, else SMs/CUs."""
    by_program = backend.runs_programs_in_turn
    stamps = [e["timestamp"] for _, events in ranks for e in events]
    origin = min(stamps) if stamps else 0
    trace = []
    for rank, events in ranks:
        trace.append({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}})
        for event in events:
            record = {"name": event["name"], "cat": "iris", "pid": rank, "tid": _track(event, by_program),
                      "ts": (event["timestamp"] - origin) / 1000,
                      "args": {k: event[k] for k in FIELDS if k not in ("timestamp", "end")}}
            record["args"]["address"] = hex(event["address"])
            if event["end"] > 0:
                record.update(ph="X", dur=max(event["end"] - event["timestamp"], 0) / 1000)
            else:
                record.update(ph="i", s="t")
            trace.append(record)
    trace += _flows(ranks, origin, by_program)
    return {"traceEvents": trace, "displayTimeUnit": "ns",
            "metadata": {"world_size": world_size, "backend": backend.name, "time_origin_ns": origin,
                         "ranks": [rank for rank, _ in ranks], "fields": list(FIELDS)}}


def _flows(ranks: list[tuple[int, list[dict]]], origin: int, by_program: bool) -> list[dict]:
    """Flows from each signal (and its program's last data move before it) to the wait on the same word."""
    by_rank = dict(ranks)
    flows, number = [], 0
    for waiter, events in ranks:
        for wait in (e for e in events if e["name"] == "wait" and e["offset"] is not None):
            signals = [(sender, s) for sender, sent in by_rank.items() for s in sent
                       if s["name"] == "signal" and s["target_rank"] == waiter and s["offset"] == wait["offset"]]
            if not signals:
                continue
            sender, signal = max(signals, key=lambda pair: pair[1]["timestamp"])
            movers = [e for e in by_rank[sender] if e["name"] in _DATA_MOVERS and e["pid"] == signal["pid"]
                      and e["target_rank"] == waiter and e["timestamp"] <= signal["timestamp"]]
            sources = [signal] + ([max(movers, key=lambda e: e["timestamp"])] if movers else [])
            for source in sources:
                number += 1
                name = f"{source['name']} -> wait"
                flows.append({"name": name, "cat": "flow", "ph": "s", "id": number, "pid": sender,
                              "tid": _track(source, by_program), "ts": (source["timestamp"] - origin) / 1000})
                flows.append({"name": name, "cat": "flow", "ph": "f", "bp": "e", "id": number, "pid": waiter,
                              "tid": _track(wait, by_program),
                              "ts": (max(wait["end"], wait["timestamp"]) - origin) / 1000})
    return flows
