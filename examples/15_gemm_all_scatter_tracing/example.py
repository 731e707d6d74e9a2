"""Traced GEMM + all-scatter: one kernel whose programs compute a tile, then store it into every rank's C,
recorded by Iris's device tracing: a ``compute`` span per tile and a ``store`` per rank it reaches.

Open the timeline (``--trace``, all ranks merged on rank 0) at https://ui.perfetto.dev; render it to
a PNG with ``python benchmarks/plot_trace.py trace.json trace.png`` (needs matplotlib).

    iris run -n 2 examples/15_gemm_all_scatter_tracing/example.py --validate --trace trace.json
"""

import sys
from pathlib import Path

import triton
import triton.language as tl

import iris
from iris.runtime import interpreted

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for examples/common
from common import all_scatter as common  # noqa: E402


@triton.jit
def gemm_scatter(context, a, b, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, c, stride_cm, stride_cn,
                 RANK: tl.constexpr, WORLD: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    dctx = iris.DeviceContext.initialize(context, RANK, WORLD, tracing=True)
    for tile in range(tl.program_id(0), tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N), tl.num_programs(0)):
        span = dctx.record_event_start(iris.TraceEvent().compute, RANK, c, tl.program_id(0), tile)
        acc, rows, cols = common.compute_tile(a, b, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, tile, UPCAST,
                                              BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
        dctx.record_event_end(span)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        place = rows[:, None].to(tl.int64) * stride_cm + (RANK * N + cols[None, :]) * stride_cn
        for i in tl.static_range(WORLD):  # start with a different rank on every rank
            dctx.store(c + place, acc.to(c.dtype.element_ty), (RANK + i) % WORLD, mask=mask)


def _launch(p) -> None:
    programs = max(1, min(p.sms, p.tiles))
    c, _, _, stride_cm, stride_cn = p.c_args()[:5]
    gemm_scatter[(programs,)](p.ctx.get_device_context(), *p.gemm_args(), c, stride_cm, stride_cn, RANK=p.rank,
                              WORLD=p.world, UPCAST=interpreted(), **common.TILE, **common.LAUNCH)
    p.ctx.device_barrier()  # every rank's tiles have landed in every C


def traced(p, args) -> None:
    _launch(p)  # the first launch compiles the kernel; recording is off until tracing.enable()
    if args.trace and not getattr(p, "traced", False):
        p.traced = True  # once: a --benchmark loop calls again
        p.ctx.tracing.enable(max_events=1 << 20)
        p.ctx.barrier()  # every rank has compiled and enabled tracing
        p.ctx.device_barrier()  # on the stream: the traced launch starts right after it on every rank
        _launch(p)
        p.ctx.tracing.disable()
        merged = p.ctx.tracing.export(args.trace, merge=True)
        if p.rank == 0:
            count = sum(1 for e in merged["traceEvents"] if e.get("ph") in ("X", "i"))
            p.ctx.log(f"trace: {count} events of {p.world} ranks in {args.trace} (open it at https://ui.perfetto.dev)")


if __name__ == "__main__":
    sys.exit(common.run(__doc__, traced))
