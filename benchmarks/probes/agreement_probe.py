"""Probe: what does the first-call agreement check (IRIS_AGREEMENT_CHECK) cost a call, on the host?

    python -m iris run -n 2 benchmarks/probes/agreement_probe.py [--calls 200]      (any backend: host only)

The check runs where a call has no plan yet: the first call of each distinct call (op, shapes, dtypes, settings)
is compared across every rank once; an agreed call is looked up in a set. This times both through
``iris.host.team.check_first_call`` itself: ``--calls`` distinct calls (each compared), then the same calls again
(each found agreed), per call on rank 0.
"""

import argparse
import time

import iris
from iris.host.team import check_first_call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="distinct calls (default 200)")
    args = parser.parse_args()
    ctx = iris.iris(1 << 20)
    x = ctx.ones(8)
    timings = []
    for _ in range(2):  # first every call is new, then every call is agreed
        ctx.barrier()
        start = time.perf_counter()
        for n in range(args.calls):
            check_first_call(ctx.team, "all_reduce", {"output_tensor": x, "input_tensor": x, "n": n, "group": None})
        timings.append((time.perf_counter() - start) / args.calls * 1e6)
    if ctx.get_rank() == 0:
        print(f"{ctx.get_num_ranks()} ranks, {ctx.backend.name}: first call of a distinct call {timings[0]:.0f} us, "
              f"an agreed call {timings[1]:.1f} us (compared {ctx.team.calls_compared} times)", flush=True)
    ctx.close()


if __name__ == "__main__":
    main()
