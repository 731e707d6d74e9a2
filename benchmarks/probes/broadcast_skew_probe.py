"""Probe: how much later than rank 0 each rank leaves ``ctx.broadcast`` (the host's agreement on a batch size).

    python -m iris run -n 2 benchmarks/probes/broadcast_skew_probe.py [--rounds 200]

ccl.py's ranks agree on each implementation's calls per sample by ``ctx.broadcast(batch, src=0)``. A rank that
leaves it after rank 0 starts its next collective calls later, and rank 0's calls wait for them. Until the
batch was sized by pilots taken after a device barrier (``_results.batch_size``), one 3-call pilot right
after that broadcast sized it, and a third of this lag went into its time per call (on an H200 host rank 1
left 71-104 us after rank 0, median; on a 2-core CPU host either rank may leave first: a negative lag).
Each round: a host barrier, the broadcast, then every rank reads the
monotonic clock (one clock for all the processes of a machine); the figure is each rank's lag behind rank 0,
microseconds, as percentiles over --rounds. Runs on any backend (only the host is timed).
"""

import os

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)

import argparse
import statistics
import time

import iris


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    ctx = iris.iris(1 << 20)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    lags = [[] for _ in range(world)]
    for round_ in range(args.rounds):
        ctx.barrier()
        ctx.broadcast(round_, src=0)
        left = time.monotonic()
        times = ctx.comm.all_gather_object(left)
        for other in range(world):
            lags[other].append((times[other] - times[0]) * 1e6)
    if rank == 0:
        print(f"backend {ctx.backend.name}, {world} ranks, {args.rounds} rounds: each rank's lag behind rank 0 "
              "leaving ctx.broadcast, us (median, 90th percentile, most)", flush=True)
        for other in range(1, world):
            ordered = sorted(lags[other])
            print(f"  rank {other}: {statistics.median(ordered):8.1f} {ordered[int(0.9 * (len(ordered) - 1))]:8.1f} "
                  f"{ordered[-1]:8.1f}", flush=True)
    ctx.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
