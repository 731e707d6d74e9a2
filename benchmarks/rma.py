"""Point-to-point bandwidth of iris put / get / load / store beside torch's copy engine.

Run as two ranks (or more: rank 0 then measures against every other rank, or with --pairs all,
every rank against every other):

    iris run -n 2 benchmarks/rma.py [--sizes 1M 2M ... 256M] [--dtype bf16] [--iters 20] [--warmup 5]
                                    [--pairs from-0|all] [--csv PATH] [--validate] [--trace]

For each pair, one rank acts (rank 0, or each rank in turn with --pairs all) and the other is the
"peer"; every other rank waits in ctx.barrier() while the actor times. One Triton kernel per op,
grid sized to the buffer:

    put    actor's buffer -> peer's buffer      iris.put
    get    peer's buffer  -> actor's buffer     iris.get
    load   peer's buffer  -> actor's buffer     iris.load, then tl.store
    store  actor's buffer -> peer's buffer      tl.load, then iris.store

and, in the same run, `dst.copy_(src)` from the actor's GPU to a plain tensor on the peer's GPU
(`copy_engine`). Where the peer has no device of its own (several ranks on one GPU, or the CPU
backend) that row is a same-device copy and is labelled `copy_engine_local`.

GB/s = buffer bytes (one direction) / median seconds / 1e9, over --iters launches after --warmup,
each bracketed by CUDA/HIP events (time.perf_counter on the CPU backend, where Triton's interpreter
runs the kernels and the defaults shrink to 64 KiB and 256 KiB). The (BLOCK, num_warps) of each op
is chosen once per size before timing. --validate first checks every op once per size, exactly,
on the rank that owns the destination. Output: a table, a CSV and (with matplotlib) a PNG, by
default under benchmarks/results/.
"""

import os

# NVLink multicast stays off (CONTRIBUTING.md, "On GPUs"); these must be set before torch is imported.
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)

import argparse
import statistics
import sys
from pathlib import Path

import torch

from _results import add_csv_argument, check_csv_argument, default_csv, git_commit, median_us, parse_size, write_csv

import iris  # before any kernel: on the CPU backend it turns on Triton's interpreter
import triton
import triton.language as tl
from iris.device import tracing
from iris.device.rma import HEAP_BASES_SLOT
from iris.device.tracing import payload_bytes, tracing_from_context

MIB = 1 << 20
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
OPS = ("put", "get", "load", "store")
WRITES_TO_PEER = ("put", "store")  # the others write the actor's buffer
EVENTS = {name: number for number, name in tracing.EVENT_NAMES.items() if name in OPS}  # their trace event kinds
GPU_CONFIGS = ((4096, 8), (8192, 16))  # (BLOCK elements, num_warps), tried once per size and op
CPU_CONFIGS = ((4096, 1),)  # the interpreter ignores num_warps; nothing to tune


@triton.jit(do_not_specialize=["cur_rank", "peer"])  # one compilation serves every peer
def rma_kernel(src, dst, n, cur_rank, peer, heap_bases, OP: tl.constexpr, BLOCK: tl.constexpr, WORLD: tl.constexpr,
               TRACE: tl.constexpr, EVENT: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    # --trace: each program's op recorded as a span (iris.device.tracing); without it, nothing is compiled in
    trace = tracing_from_context(heap_bases - HEAP_BASES_SLOT, WORLD, TRACE)
    span = trace.start(EVENT, cur_rank, peer, dst + offs, tl.program_id(0), -1, payload_bytes(src + offs, mask))
    if OP == "put":
        iris.put(src + offs, dst + offs, cur_rank, peer, heap_bases, mask=mask)
    elif OP == "get":
        iris.get(src + offs, dst + offs, peer, cur_rank, heap_bases, mask=mask)
    elif OP == "load":
        tl.store(dst + offs, iris.load(src + offs, cur_rank, peer, heap_bases, mask=mask), mask=mask)
    else:
        iris.store(dst + offs, tl.load(src + offs, mask=mask), cur_rank, peer, heap_bases, mask=mask)
    trace.end(span)


def parse_args(gpu: bool) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=parse_size, default=None,
                        help="buffer sizes, e.g. 64K 1M 256M (a bare number is MiB); default 1M..256M in powers "
                             "of two on a GPU, 64K 256K on the CPU backend")
    parser.add_argument("--dtype", choices=DTYPES, default="bf16", help="element type of the buffers (default bf16)")
    parser.add_argument("--iters", type=int, default=None, help="timed launches per op and size (default 20; 2 on CPU)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed launches first (default 5; 1 on CPU)")
    add_csv_argument(parser, "rma")
    parser.add_argument("--validate", action="store_true", help="check every op once per size; exit 1 on a mismatch")
    parser.add_argument("--pairs", choices=("from-0", "all"), default="from-0",
                        help="from-0: rank 0 against every other rank (default); all: every ordered pair of ranks")
    parser.add_argument("--trace", action="store_true", help="tracing on (ctx.tracing.enable()) and the kernel built "
                        "to record each program's op, to compare with a run without it")
    args = parser.parse_args()
    check_csv_argument(parser, args, "rma")
    args.sizes = sorted(set(args.sizes or ([MIB << i for i in range(9)] if gpu else [64 << 10, 256 << 10])))
    args.iters = args.iters if args.iters is not None else (20 if gpu else 2)
    args.warmup = args.warmup if args.warmup is not None else (5 if gpu else 1)
    element = torch.empty((), dtype=DTYPES[args.dtype]).element_size()
    bad = [s for s in args.sizes if s % 16 or s // element >= 2**31]
    if bad or args.iters < 1 or args.warmup < 0:
        parser.error(f"need --iters >= 1, --warmup >= 0 and sizes that are multiples of 16 bytes with fewer than "
                     f"2**31 elements; got iters={args.iters}, warmup={args.warmup}, bad sizes={bad}")
    return args


def kernel_launch(op, src, dst, n, actor, peer, heap_bases, block, warps, trace=False):
    grid = (triton.cdiv(n, block),)
    return lambda: rma_kernel[grid](src, dst, n, actor, peer, heap_bases, OP=op, BLOCK=block, WORLD=heap_bases.numel(),
                                    TRACE=trace, EVENT=EVENTS[op], num_warps=warps)


def tuned_launch(op, configs, gpu, *args, trace=False):
    """(config, launch) of ``op`` with the fastest (BLOCK, num_warps) in ``configs``, 3 timed launches each."""
    launches = {cfg: kernel_launch(op, *args, *cfg, trace=trace) for cfg in configs}
    best = min(configs, key=lambda cfg: median_us(launches[cfg], 1, 3, gpu)) if len(configs) > 1 else configs[0]
    return best, launches[best]


def copy_launch(src, dst):
    return lambda: dst.copy_(src)


def random_data(rank: int, n: int, dtype, device) -> torch.Tensor:
    """Rank ``rank``'s source values; drawn on the CPU so that every rank can recompute them."""
    return torch.randn(n, generator=torch.Generator().manual_seed(1000 + rank)).to(dtype).to(device)


def check(ctx, what: str, launch, actor: int, owner: int, dst, expected) -> bool:
    """Collective: poison the owner's destination, run the op once on the actor, compare exactly on the owner."""
    rank = ctx.get_rank()
    if rank == owner:
        dst.fill_(float("nan"))  # NaN never compares equal: an element left unwritten fails
    ctx.barrier()
    if rank == actor:
        launch()
    ctx.barrier()
    ok = True
    if rank == owner:
        ok = torch.equal(dst, expected.to(dst.device))
        if not ok:
            wrong = int((dst != expected.to(dst.device)).sum())
            print(f"VALIDATION FAILED: {what}: {wrong} of {dst.numel()} elements wrong on rank {owner}", flush=True)
    return ctx.broadcast(ok, src=owner)


def bandwidth_by_op(rows) -> dict:
    """{op: [(MiB, slowest, median, fastest GB/s over the pairs measured), ...] by size}, ops in row order."""
    lines = {}
    for r in rows:
        lines.setdefault(r["op"], {}).setdefault(r["bytes"] / MIB, []).append(r["gbps"])
    return {op: [(mib, min(g), statistics.median(g), max(g)) for mib, g in sorted(by_size.items())]
            for op, by_size in lines.items()}


def write_outputs(rows, path: Path, world: int) -> None:
    write_csv(rows, path)
    plot(rows, path, world)


def plot(rows, path: Path, world: int) -> None:
    """``path``'s PNG: GB/s against size per op (a band over the pairs when several were timed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot skipped: matplotlib is not installed (pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    pairs = len(dict.fromkeys((r["actor"], r["peer"]) for r in rows))
    for op, points in bandwidth_by_op(rows).items():
        mib, low, middle, high = zip(*points)
        label = op if pairs == 1 else f"{op} (median of {pairs} pairs; band: slowest to fastest)"
        (line,) = ax.plot(mib, middle, marker="o", label=label)
        if pairs > 1:
            ax.fill_between(mib, low, high, color=line.get_color(), alpha=0.2)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("buffer size (MiB)")
    ax.set_ylabel("GB/s (one direction)")
    ax.set_title(f"iris RMA vs copy engine: {rows[0]['gpu']}, {world} ranks, {rows[0]['commit']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.savefig(path.with_suffix(".png"), dpi=120, bbox_inches="tight")
    plt.close(fig)
    print(f"PNG: {path.with_suffix('.png')}")


def main() -> int:
    gpu = iris.runtime.SELECTED in ("cuda", "hip")
    args = parse_args(gpu)
    dtype = DTYPES[args.dtype]
    ctx = iris.iris(2 * max(args.sizes) + MIB)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    if world < 2:
        ctx.error("this benchmark needs at least 2 ranks: iris run -n 2 benchmarks/rma.py")
        ctx.close()
        return 2
    nmax = max(args.sizes) // torch.empty((), dtype=dtype).element_size()
    src, dst = ctx.empty(nmax, dtype=dtype), ctx.empty(nmax, dtype=dtype)
    src.copy_(random_data(rank, nmax, dtype, device))  # sources are never written by any op
    heap_bases = ctx.get_heap_bases()
    configs = GPU_CONFIGS if gpu else CPU_CONFIGS
    gpu_name = torch.cuda.get_device_name(device) if gpu else "cpu"
    if args.trace:
        ctx.tracing.enable(max_events=1_000_000)  # later events are dropped; the kernel still takes the recording path
    base = {"gpu": gpu_name, "backend": iris.runtime.SELECTED, "world_size": world, "version": iris.__version__,
            "commit": git_commit(), "trace": int(args.trace)}
    rows, status = [], 0
    pairs = [(0, peer) for peer in range(1, world)] if args.pairs == "from-0" else \
        [(actor, peer) for actor in range(world) for peer in range(world) if peer != actor]
    ctx.barrier()
    for actor, peer in pairs:
        peer_device = ctx.backend.device_for(peer)
        copy_op = "copy_engine" if peer_device != ctx.backend.device_for(actor) else "copy_engine_local"
        if rank == actor:
            where = "a tensor on the peer's device" if copy_op == "copy_engine" else \
                "the same device (the peer shares it): a local copy, not a transfer between devices"
            print(f"rank {actor} <-> rank {peer}: {device} <-> {peer_device}; {copy_op} copies to {where}",
                  flush=True)
        copy_dst = torch.empty(nmax, dtype=dtype, device=peer_device) if rank == actor else None
        # The values the other side's source holds, for the owner's checks.
        theirs = random_data(peer if rank == actor else actor, nmax, dtype, device) \
            if args.validate and rank in (actor, peer) else None
        for nbytes in args.sizes:
            n = nbytes // src.element_size()
            launches, chosen = {}, {}
            if rank == actor:
                launches[copy_op] = copy_launch(src[:n], copy_dst[:n])  # the reference row comes first
                for op in OPS:  # choose (BLOCK, num_warps) once per size, before validation and timing
                    chosen[op], launches[op] = tuned_launch(op, configs, gpu, src[:n], dst[:n], n, actor, peer,
                                                            heap_bases, trace=args.trace)
            if args.validate:
                for op in (copy_op, *OPS):
                    owner = peer if op in WRITES_TO_PEER else actor
                    target = expected = None
                    if rank == owner:
                        target = copy_dst[:n] if op == copy_op else dst[:n]
                        expected = src[:n] if op == copy_op else theirs[:n]
                    if not check(ctx, f"{op} {nbytes / MIB:g} MiB, {actor} -> {peer}", launches.get(op), actor,
                                 owner, target, expected):
                        status = 1
                        break
                if status:
                    break
            results = None
            if rank == actor:
                results = {op: median_us(fn, args.warmup, args.iters, gpu) for op, fn in launches.items()}
                summary = ", ".join(f"{op} {nbytes / us / 1e3:.4g}" for op, us in results.items())
                tuned = " ".join(f"{op}={b}x{w}" for op, (b, w) in chosen.items())
                checked = " validated," if args.validate else ""
                print(f"[{nbytes / MIB:g} MiB, {actor} -> {peer}]{checked} GB/s: {summary} (BLOCK x warps: {tuned})",
                      flush=True)
            results = ctx.broadcast(results, src=actor)  # rank 0 writes every pair's rows
            copy_gbps = nbytes / results[copy_op] / 1e3
            for op, us in results.items():
                gbps = nbytes / us / 1e3  # bytes / (us * 1e-6) / 1e9
                rows.append(dict(base, actor=actor, peer=peer, op=op, bytes=nbytes, median_us=float(f"{us:.6g}"),
                                 gbps=float(f"{gbps:.6g}"), ratio_to_copy_engine=float(f"{gbps / copy_gbps:.4g}")))
            ctx.barrier()
        if status:
            break
    if rank == 0 and rows and not status:
        print(f"\n{'size MiB':>9} {'pair':>6}  {'op':<18} {'GB/s':>10} {'ratio to copy engine':>21}")
        for r in rows:
            print(f"{r['bytes'] / MIB:>9g} {r['actor']:>2}->{r['peer']:<2}  {r['op']:<18} {r['gbps']:>10.4g} "
                  f"{r['ratio_to_copy_engine']:>21.3g}")
        if any(r["op"] == "copy_engine_local" for r in rows):
            print("note: copy_engine_local is a same-device copy (ranks share a device), not a link transfer")
        write_outputs(rows, args.csv or default_csv("rma", gpu_name, world), world)
    ctx.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
