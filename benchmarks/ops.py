"""Fused GEMM + communication side by side: iris.ops, torch.matmul then NCCL, the GEMM alone, the communication alone.

    iris run -n 2 benchmarks/ops.py [--ops matmul_all_reduce ...] [--m 128 512 1024 4096 16384] [--n 8192 14336]
                                    [--k 8192] [--iters 10] [--warmup 3] [--csv PATH] [--validate] [--trace]
                                    [--profile [CALLS]] [--timeline [CALLS]] [--host] [--heap-pad-mib MIB]
                                    [--device-pad-mib MIB]

The shapes are a tensor-parallel MLP's (W ranks; M 128 and 512 are decode-like). For M, N, K from
the command line, each rank's part:

    all_gather_matmul      A_shard (M, K/W), B (K, N)        A gathered along K, then the GEMM
    matmul_all_gather      A (M/W, K), B (K, N)              the GEMM, then rows gathered: (M, N)
    gemm_all_scatter       A (M, K), B (K, N/W)              the GEMM, then columns gathered: (M, N)
    matmul_all_reduce      A (M, N/W), B (N/W, K)            the transposed role: partial sums of (M, K)
    matmul_reduce_scatter  A (M, N/W), B (N/W, K)            ... reduced and scattered: (M, K/W)

For every op and shape, in one run, process group and on the same tensors:

    fused       ctx.ops.<op>
    torch+nccl  torch.matmul followed by the torch.distributed collective (with the layout copy
                torch needs where NCCL gathers or scatters along rows and the op along columns)
    torch fused torch's own fused symmetric-memory op where it has one (torch.ops.symm_mem):
                fused_all_gather_matmul (gather_dim 1 for all_gather_matmul, 0 for
                matmul_all_gather) and fused_matmul_reduce_scatter (scatter_dim 1); the other ops
                and simulation (several ranks on one GPU) leave it empty, with the reason printed
    gemm        the GEMM alone: torch.matmul (cuBLAS), and iris.ops.matmul
    comm        the communication alone: NCCL, and the iris.ccl collective on heap buffers

It prints each fused time's speedup over torch+nccl (and over torch fused) and its overlap efficiency,
max(T_gemm, T_comm) / T_fused with the faster GEMM and the faster communication (1: the
communication is completely hidden behind the faster GEMM). Each figure is the median of --iters
calls between CUDA events after --warmup calls (the first calls autotune the GEMM) and --settle-ms
of untimed calls (a GPU that sat idle while kernels compiled is slow at first), every figure of
a shape sampled in turns (a GPU at its power limit clocks lower the longer it is busy: timed one
after the other, the first figure would get the fresher GPU), each sample after a device barrier
and a head start of LEAD_US for the host (the sample times the GPU's work, not a launch path). --validate
compares each fused output with torch+nccl's. --profile [CALLS] then runs each fused op CALLS more
times (5; 1 on the CPU) with tracing on, each call started as a timed sample is, and says where its
time went (iris.tracing.summarize; the mean over ranks, then the median over the calls): per
program, the time in compute spans (the GEMM's tiles), in pushes, reductions, waits and barriers,
the time no span covers, and the tail after the last tile; columns profile_* of the CSV.
--timeline [CALLS] (GPU) profiles CALLS more calls (3) with torch.profiler, each started as a timed sample
is, and prints the GPU's activities in the call of median span: every kernel and copy, the vendor's GEMMs
and the copy engine's included, which tracing does not see (benchmarks/_timeline.py); columns
timeline_span_us and timeline_busy_us (the time some activity ran). --host (GPU) also times
the host's share of a fused call (fused_host_us: host microseconds per call issued back to back;
where it exceeds the GPU's time, the op is host-bound). Output: a table, a CSV and a PNG under
benchmarks/results/. On the CPU backend it is a smoke test at tiny sizes, not a figure.
--heap-pad-mib MIB puts MIB of symmetric heap before every workspace, --device-pad-mib MIB holds MIB more of
device memory outside the heap, both for the whole run (columns heap_pad_mib, device_pad_mib): to tell whether a
fused op's time changes with its workspace's heap offset or with the process's memory footprint, which both grow
along a sweep (the heap never frees and ctx.ops keeps every problem's workspace).
--breakdown CSV [--below 0.9] runs nothing: it prints, from a --profile run's CSV, where each fused
call spends its time beyond the GEMM alone (:func:`breakdown`), as a Markdown table.
"""

import os

# NVLink multicast stays off (CONTRIBUTING.md, "On GPUs"); these must be set before torch is imported.
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)

import argparse
import csv
import functools
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from _timeline import busy_us, call_timeline, describe, span_us
from _timing import nccl_facts
from _results import (SPIN_CYCLES_PER_US, add_csv_argument, check_csv_argument, default_csv, git_commit, host_us,
                      interleaved_median_us, why_not, write_csv)

import iris
from iris.runtime.distributed import job_world_size
from iris.ops import FusedConfig, matmul
from iris.testing.fused_ops import OPS


# The kinds of span the fused ops record (docs/tracing.md), in the profile's columns.
PROFILED = ("barrier", "compute", "put", "reduce", "wait")


# The GPU's head start on each sample (see _results.interleaved_median_us): longer than the slowest host
# path among a shape's calls (iris.ops.matmul's autotuned launch, torch's fused ops).
LEAD_US = 300.0


def parse_args(gpu: bool) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    parser.add_argument("--m", nargs="+", type=int, default=[128, 512, 1024, 4096, 16384] if gpu else [64])
    parser.add_argument("--n", nargs="+", type=int, default=[8192, 14336] if gpu else [64])
    parser.add_argument("--k", nargs="+", type=int, default=[8192] if gpu else [64])
    parser.add_argument("--iters", type=int, default=10 if gpu else 1)
    parser.add_argument("--warmup", type=int, default=3 if gpu else 1)
    parser.add_argument("--settle-ms", type=float, default=300.0 if gpu else 0.0,
                        help="after the warmup, run a shape's calls in turns for this long before timing them")
    add_csv_argument(parser, "ops")
    parser.add_argument("--validate", action="store_true", help="compare each fused output with torch+nccl's")
    parser.add_argument("--trace", action="store_true", help="tracing on (ctx.tracing.enable()) for the whole run: "
                        "the fused ops that record events (matmul_all_reduce, matmul_reduce_scatter) record them, to "
                        "compare their times with a run without it")
    parser.add_argument("--profile", type=int, nargs="?", const=5 if gpu else 1, default=0, metavar="CALLS",
                        help="after timing, CALLS traced calls of each fused op (default 5; 1 on the CPU), each "
                        "started as a timed sample is: where its time went (per program: compute, put, reduce, "
                        "wait, barrier, idle; the tail), the median over the calls")
    parser.add_argument("--timeline", type=int, nargs="?", const=3, default=0, metavar="CALLS",
                        help="(GPU) after timing, CALLS calls of each fused op (default 3) under torch.profiler: "
                        "the GPU's kernels and copies in the call of median span, printed")
    parser.add_argument("--host", action="store_true", help="also time the host's share of each fused call (GPU)")
    parser.add_argument("--heap-pad-mib", type=int, default=0, metavar="MIB",
                        help="this much symmetric heap allocated before every workspace, for the whole run")
    parser.add_argument("--device-pad-mib", type=int, default=0, metavar="MIB",
                        help="this much device memory held outside the heap for the whole run")
    parser.add_argument("--breakdown", type=Path, default=None, metavar="CSV",
                        help="print where each fused call of a --profile run's CSV spends its time beyond the GEMM "
                        "alone (a Markdown table, see breakdown()) and exit: nothing runs, no ranks needed")
    parser.add_argument("--below", type=float, default=float("inf"),
                        help="with --breakdown: only the rows whose overlap efficiency is below this (default: all)")
    parser.add_argument("--config", default="", help="FusedConfig fields for the fused ops, e.g. "
                        "block_size_n=128,num_stages=4 (default: FusedConfig()); switches as 0/1: tma_loads=1")
    args = parser.parse_args()
    check_csv_argument(parser, args, "ops")
    if args.profile < 0 or args.timeline < 0:
        parser.error("--profile and --timeline take a number of calls >= 1")
    if args.timeline and not gpu and not args.breakdown:
        parser.error("--timeline needs a GPU (torch.profiler's CUDA activities); the CPU backend has none")
    if min(args.heap_pad_mib, args.device_pad_mib) < 0:
        parser.error("--heap-pad-mib and --device-pad-mib take a size in MiB >= 0")
    try:
        args.config = FusedConfig(**{k: config_value(k, v) for k, v in (kv.split("=") for kv in args.config.split(",")
                                                                        if kv)})
    except (TypeError, ValueError) as exc:
        parser.error(f"--config {args.config!r}: {exc}")
    return args


def config_value(field: str, text: str):
    """A FusedConfig field's value from the command line: 0/1 (or false/true) for the switches, the variant's
    name for all_reduce_variant, else an int."""
    flag = {"0": False, "1": True, "false": False, "true": True}
    if field == "all_reduce_variant":
        return text
    if field in ("tma_loads", "reduce_at_owner", "copy_engine", "vendor_gemm"):
        if text.lower() not in flag:
            raise ValueError(f"{field}={text!r}: give 0 or 1")
        return flag[text.lower()]
    return int(text)


@functools.cache
def torch_fused_ops():
    """(fused_all_gather_matmul, fused_matmul_reduce_scatter, group name) of torch symmetric memory, set up
    once for the world group (older torch needs it enabled per group; newer torch warns that it need not)."""
    import torch.distributed._symmetric_memory as symm_mem

    group = dist.group.WORLD.group_name
    symm_mem.enable_symm_mem_for_group(group)
    ops = torch.ops.symm_mem
    return ops.fused_all_gather_matmul, ops.fused_matmul_reduce_scatter, group


class Problem:
    """One op and shape on this rank: the operands, the fused call, and its torch + NCCL counterpart."""

    def __init__(self, ctx, arena, op: str, M: int, N: int, K: int, config: FusedConfig):
        world, device = ctx.get_num_ranks(), ctx.get_device()
        for name, size in (("M", M), ("N", N), ("K", K)):
            if size % world:
                raise SystemExit(f"{op}: {name}={size} is not divisible by the {world} ranks")
        self.op, self.world = op, world
        dt = torch.bfloat16
        g = torch.Generator(device=device).manual_seed(1234 + ctx.get_rank())
        replicated = torch.Generator(device=device).manual_seed(4321)  # the same on every rank

        def rand(*shape, generator=g):
            return torch.randn(*shape, generator=generator, device=device, dtype=dt) / shape[-1] ** 0.25

        if op == "all_gather_matmul":
            self.A, self.B = rand(M, K // world), rand(K, N)
            out_shape, self.comm_rows, self.comm_cols = (M, N), M, K // world
        elif op == "matmul_all_gather":
            # B is one weight on every rank, as in a model: torch's fused op (gather A, then multiply by this
            # rank's B) computes the same product only then
            self.A, self.B = rand(M // world, K), rand(K, N, generator=replicated)
            out_shape, self.comm_rows, self.comm_cols = (M, N), M // world, N
        elif op == "gemm_all_scatter":
            self.A, self.B = rand(M, K), rand(K, N // world)
            out_shape, self.comm_rows, self.comm_cols = (M, N), M, N // world
        else:  # the transposed role: the K-shard is N / W, the output is (M, K)
            self.A, self.B = rand(M, N // world), rand(N // world, K)
            out_shape = (M, K // world) if op == "matmul_reduce_scatter" else (M, K)
            self.comm_rows, self.comm_cols = M, K
        if op in ("matmul_all_gather", "gemm_all_scatter"):  # peers write the output: a view of the heap arena
            self.out = arena[: out_shape[0] * out_shape[1]].view(out_shape)
        else:
            self.out = torch.empty(out_shape, dtype=dt, device=device)
        self.ref = torch.empty(out_shape, dtype=dt, device=device)
        # The GEMM alone has the whole A (all_gather_matmul: the gathered (M, K)).
        self.gemm_a = rand(M, K) if op == "all_gather_matmul" else self.A
        self.flops = 2 * self.gemm_a.shape[0] * self.B.shape[1] * self.gemm_a.shape[1]
        self.ctx, self.config = ctx, config

    def fused(self):
        getattr(self.ctx.ops, self.op)(self.out, self.A, self.B, config=self.config)

    def gemm_torch(self):
        return torch.matmul(self.gemm_a, self.B)

    def gemm_iris(self):
        return matmul(self.gemm_a, self.B)

    def torch_nccl(self):
        """torch.matmul then the NCCL collective (plus the layout copies torch needs); result in self.ref."""
        W, op = self.world, self.op
        if op == "all_gather_matmul":
            parts = torch.empty(W, *self.A.shape, dtype=self.A.dtype, device=self.A.device)
            dist.all_gather_into_tensor(parts.view(-1, parts.shape[-1]), self.A)
            torch.matmul(parts.permute(1, 0, 2).reshape(self.A.shape[0], -1), self.B, out=self.ref)
        elif op == "matmul_all_gather":
            dist.all_gather_into_tensor(self.ref, torch.matmul(self.A, self.B))
        elif op == "gemm_all_scatter":
            parts = torch.empty(W, self.A.shape[0], self.B.shape[1], dtype=self.A.dtype, device=self.A.device)
            dist.all_gather_into_tensor(parts.view(-1, parts.shape[-1]), torch.matmul(self.A, self.B))
            self.ref.copy_(parts.permute(1, 0, 2).reshape(self.ref.shape))
        elif op == "matmul_all_reduce":
            torch.matmul(self.A, self.B, out=self.ref)
            dist.all_reduce(self.ref)
        else:  # NCCL scatters row blocks: the column blocks of the product first become row blocks
            whole = torch.matmul(self.A, self.B)
            blocks = whole.view(whole.shape[0], W, -1).transpose(0, 1).contiguous()
            dist.reduce_scatter_tensor(self.ref, blocks.view(-1, blocks.shape[-1]))

    def torch_fused(self):
        """(call, why-not) for torch's own fused op; the call returns this op's result."""
        if self.A.device.type != "cuda" or iris.config.simulation():
            return None, "torch symmetric memory needs one GPU per rank"
        if self.op not in ("all_gather_matmul", "matmul_all_gather", "matmul_reduce_scatter"):
            return None, "torch has no fused op for it"
        try:
            fused_ag, fused_rs, group = torch_fused_ops()
        except Exception as exc:  # a torch without them
            return None, why_not(exc)
        if self.op == "matmul_reduce_scatter":  # (M, N/W) columns: scatter along the product's last dim
            return lambda: fused_rs(self.A, self.B, "sum", 1, group), ""
        gather_dim = 1 if self.op == "all_gather_matmul" else 0  # along K, or along M
        return lambda: fused_ag(self.A, [self.B], gather_dim, group, return_A=False)[1][0], ""

    def comm_calls(self, arena):
        """{label: call} of the communication alone: NCCL, and iris.ccl on heap views of the arena."""
        W, rows, cols, op = self.world, self.comm_rows, self.comm_cols, self.op
        device, dt = self.A.device, self.A.dtype
        plain = torch.empty(rows * cols, dtype=dt, device=device)
        gathered = torch.empty(W * rows * cols, dtype=dt, device=device)
        heap_in = arena[: rows * cols].view(rows, cols)
        heap_out = arena[rows * cols: (W + 1) * rows * cols]
        ccl = self.ctx.ccl
        if op in ("all_gather_matmul", "matmul_all_gather", "gemm_all_scatter"):
            return {"nccl": lambda: dist.all_gather_into_tensor(gathered.view(W * rows, cols), plain.view(rows, cols)),
                    "iris.ccl": lambda: ccl.all_gather(heap_out.view(W * rows, cols), heap_in)}
        if op == "matmul_all_reduce":
            return {"nccl": lambda: dist.all_reduce(plain),
                    "iris.ccl": lambda: ccl.all_reduce(heap_out[: rows * cols].view(rows, cols), heap_in)}
        return {"nccl": lambda: dist.reduce_scatter_tensor(plain[: rows * cols // W], plain),
                "iris.ccl": lambda: ccl.reduce_scatter(heap_out[: rows * cols // W], heap_in.view(-1))}


def profile_columns(calls: list[list[dict]]) -> dict:
    """The profile_* columns from traced calls: ``calls[i][r]`` is rank r's :func:`iris.tracing.summarize`
    of call i. Each figure is the mean over the ranks of one call, then the median over the calls.

    Example:
        >>> profile_columns([[ctx.tracing.summary() for each rank] for each call])["profile_compute_us"]
    """
    def per_call(summaries: list[dict]) -> dict:
        world = len(summaries)
        columns = {f"profile_{key}_us": sum(s[f"{key}_us"] for s in summaries) / world
                   for key in ("span", "idle", "tail")}
        for kind in PROFILED:
            columns[f"profile_{kind}_us"] = sum(s["kinds"].get(kind, {}).get("per_program_us", 0.0)
                                                for s in summaries) / world
        compute = [s["kinds"].get("compute", {}) for s in summaries]
        columns["profile_compute_per_tile_us"] = (sum(c.get("count", 0) * c.get("mean_us", 0.0) for c in compute)
                                                  / max(sum(c.get("count", 0) for c in compute), 1))
        return columns

    each = [per_call(summaries) for summaries in calls]
    columns = {key: statistics.median(c[key] for c in each) for key in each[0]}
    columns["profile_programs"] = calls[0][0]["programs"]
    columns["profile_calls"] = len(calls)
    return columns


def one_call_us(fn, gpu: bool) -> float:
    """Microseconds one call of ``fn`` takes: between two CUDA events around it on a GPU (where the stream
    is), by the host's clock on the CPU backend (where the call runs to its end)."""
    if not gpu:
        began = time.perf_counter()
        fn()
        return (time.perf_counter() - began) * 1e6
    began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    began.record()
    fn()
    ended.record()
    ended.synchronize()
    return began.elapsed_time(ended) * 1e3


BREAKDOWN_COLUMNS = ("compute", "put + reduce", "wait + barrier", "idle", "outside", "tracing", "rest")


def breakdown(row: dict) -> dict:
    """Where a profiled fused call (a CSV row of --profile) spends its time beyond the faster GEMM alone, in
    microseconds: ``fused = gemm + compute + put + reduce + wait + barrier + idle + outside + rest``, with
    ``compute`` the compute per program beyond the GEMM alone (tiles slowed by the communication beside them, or
    a tile loop slower than cuBLAS's; negative where the fused op's tiles beat the GEMM alone), ``put +
    reduce`` the communication the computing programs do, ``idle`` what no span covers (programs done early,
    gaps), ``outside`` the traced call's time outside its kernel's span (launches, barrier launches, the
    copies' fork and join), ``tracing`` the untraced call's time less the traced one's (tracing's own cost,
    negative; and the two calls' difference), and ``rest`` what the per-kind figures (means over programs)
    leave of the span. A run before the traced calls were timed (no profile_call_us) puts all of the call's
    time outside the span in ``outside``, and ``tracing`` is 0.

    Example:
        >>> breakdown(row)["put + reduce"]   # microseconds a program spends sending and summing partials
    """
    def f(key: str) -> float:
        return float(row[key])

    terms = {"gemm": min(f("cublas_us"), f("iris gemm_us"))}
    terms["compute"] = f("profile_compute_us") - terms["gemm"]
    terms["put + reduce"] = f("profile_put_us") + f("profile_reduce_us")
    terms["wait + barrier"] = f("profile_wait_us") + f("profile_barrier_us")
    terms["idle"] = f("profile_idle_us")
    traced = f("profile_call_us") if row.get("profile_call_us") else f("fused_us")
    terms["outside"] = traced - f("profile_span_us")
    terms["tracing"] = f("fused_us") - traced
    terms["rest"] = f("fused_us") - sum(terms.values())
    return terms


def print_breakdown(path: Path, below: float) -> None:
    """The :func:`breakdown` of every row of a profiled run's CSV whose overlap efficiency is below ``below``,
    as a Markdown table (microseconds)."""
    with open(path) as f:
        rows = [row for row in csv.DictReader(f) if float(row["overlap_efficiency"]) < below]
    print("| op | M | N | overlap | fused | GEMM alone | comm alone | " + " | ".join(BREAKDOWN_COLUMNS) + " |")
    print("|---" * (7 + len(BREAKDOWN_COLUMNS)) + "|")
    for row in rows:
        terms = breakdown(row)
        comm = min(float(row["nccl_us"]), float(row["iris.ccl_us"]))
        figures = [float(row["fused_us"]), terms["gemm"], comm, *(terms[key] for key in BREAKDOWN_COLUMNS)]
        print(f"| {row['op']} | {row['M']} | {row['N']} | {float(row['overlap_efficiency']):.2f} | "
              + " | ".join(f"{x:.1f}" for x in figures) + " |")


def heap_bytes(args, world: int, arena: int) -> int:
    """Symmetric heap per rank for the whole sweep: the arena (``arena`` bf16 elements) and the fused
    ops' workspaces. The heap never frees, and ctx.ops keeps each fused op's workspace for its
    problem, so the workspaces of all the shapes add up."""
    bf16, flag, align, tile = 2, 8, 256, 16  # bytes: element, int64 flag, allocation alignment; tiles >= 16 x 16
    total = arena * bf16 + align + (args.heap_pad_mib << 20) + align
    for M in args.m:
        for K in args.k:  # the transposed ops' output is (M, K): their workspace is per (M, K), whatever N
            flags = -(-M // tile) * -(-K // tile) * flag + 2 * align  # a flag per output tile; two allocations
            if "matmul_all_reduce" in args.ops:  # partials: a slot of the whole (M, K) per member: W M K
                total += world * M * K * bf16 + flags
            if "matmul_reduce_scatter" in args.ops:  # partials: a slot of the owned (M, K/W) per member: M K
                total += M * K * bf16 + flags
            if "all_gather_matmul" in args.ops:  # per (M, N, K): A gathered, W slices (M, K/W), a flag per row block
                total += len(args.n) * (M * K * bf16 + -(-M // tile) * flag + 2 * align)
    return total


def main() -> int:
    gpu = iris.runtime.SELECTED != "cpu"
    args = parse_args(gpu)
    if args.breakdown:
        print_breakdown(args.breakdown, args.below)
        return 0
    world = job_world_size()
    biggest = max(m * max(n, k) for m in args.m for n in args.n for k in args.k)
    arena_numel = (world + 2) * biggest  # a peer-written output, then iris.ccl's input and its W outputs
    ctx = iris.iris(heap_bytes(args, world, arena_numel))
    rank = ctx.get_rank()
    arena = ctx.empty(arena_numel, dtype=torch.bfloat16)
    pads = (ctx.empty(args.heap_pad_mib << 20, dtype=torch.uint8),  # held to the end: workspaces come after it
            torch.empty(args.device_pad_mib << 20, dtype=torch.uint8, device=ctx.get_device()))
    if args.trace:
        ctx.tracing.enable(max_events=1_000_000)  # later events are dropped; the kernels still take the recording path
    gpu_name = torch.cuda.get_device_name(ctx.get_device()) if gpu else "cpu"
    base = {"gpu": gpu_name, "backend": iris.runtime.SELECTED, "world_size": world, "version": iris.__version__,
            "commit": git_commit(), **nccl_facts(), "iters": args.iters, "trace": int(args.trace),
            # every way's time by one method: CUDA events around one call (benchmarks/_timing.py's device method
            # with one call a sample: these calls last hundreds of microseconds), after a device barrier and the
            # GPU's head start; on the CPU backend the wall clock
            "method": "device" if gpu else "eager", "calls_per_sample": 1,
            "graph_replay": int(iris.config.graph_replay()), "native_replay": int(iris.config.native_replay()),
            "heap_pad_mib": args.heap_pad_mib, "device_pad_mib": args.device_pad_mib,
            "config": " ".join(f"{k}={v}" for k, v in vars(args.config).items())}
    rows, problems, reasons = [], [], set()
    if rank == 0:
        print(f"{'op':22} {'M':>6} {'N':>6} {'K':>6} {'fused':>9} {'torch+nccl':>10} {'torch fused':>11} "
              f"{'cublas':>9} {'iris gemm':>9} {'nccl':>9} {'iris.ccl':>9} {'speedup':>8} {'vs fused':>8} "
              f"{'overlap':>8}  (us)", flush=True)

    def start_as_a_sample():
        """What a timed sample does before its first call: a device barrier, then the GPU's head start."""
        ctx.device_barrier()
        if gpu:
            torch.cuda._sleep(int(LEAD_US * SPIN_CYCLES_PER_US))

    def profiled(p) -> dict:
        """args.profile traced calls of p's fused op (after one that compiles the traced kernel), each after
        a device barrier and the GPU's head start, as a timed sample starts (one call alone starts when
        each rank's host gets there: its barrier spans then measure the ranks' skew); profile_* columns."""
        if not ctx.tracing.enabled:
            ctx.tracing.enable(max_events=1_000_000)
        p.fused()
        ctx.barrier()
        calls, call_us = [], []
        for _ in range(args.profile):
            ctx.tracing.reset()
            start_as_a_sample()
            call_us.append(one_call_us(p.fused, gpu))
            ctx.barrier()
            calls.append(ctx.comm.all_gather_object(ctx.tracing.summary()))
        if not args.trace:
            ctx.tracing.disable()
        return {**profile_columns(calls), "profile_call_us": statistics.median(call_us)}

    def timelined(p) -> tuple[dict, list]:
        """args.timeline calls of p's fused op under torch.profiler, each started as a timed sample is: the
        timeline_* columns and the activities of the call of median span (rank 0's)."""
        ctx.barrier()
        timelines = sorted((call_timeline(p.fused, start_as_a_sample) for _ in range(args.timeline)), key=span_us)
        middle = timelines[len(timelines) // 2]
        ctx.barrier()
        return {"timeline_span_us": span_us(middle), "timeline_busy_us": busy_us(middle)}, middle

    def timed(calls: dict) -> dict:
        """Each call's median time, the samples taken in turns (see _results.interleaved_median_us), rank 0's."""
        ctx.barrier()
        us = interleaved_median_us(calls, args.warmup, args.iters, gpu, sample_us=0,
                                   agree=lambda b: ctx.broadcast(b, src=0), before_each=ctx.device_barrier,
                                   settle_ms=args.settle_ms, lead_us=LEAD_US if gpu else 0.0)
        return ctx.broadcast(us, src=0)

    for op in args.ops:
        for M in args.m:
            for N in args.n:
                for K in args.k:
                    p = Problem(ctx, arena, op, M, N, K, args.config)
                    if args.validate:
                        p.fused()
                        ctx.barrier()
                        p.torch_nccl()
                        error = ((p.out.float() - p.ref.float()).norm() / p.ref.float().norm()).item()
                        if error > 2e-2:
                            problems.append(f"{op} {M}x{N}x{K}: relative error {error:.3g} against torch+nccl")
                    calls = {"fused": p.fused, "torch+nccl": p.torch_nccl}
                    torch_fused, why = p.torch_fused()
                    if torch_fused is not None:
                        try:
                            theirs = torch_fused().float()  # a first call: does torch take this shape?
                            if args.validate:
                                error = ((p.out.float() - theirs).norm() / theirs.norm()).item()
                                if error > 2e-2:
                                    problems.append(f"{op} {M}x{N}x{K}: torch fused differs from iris by {error:.3g}")
                            calls["torch fused"] = torch_fused
                        except Exception as exc:  # a shape or dtype torch refuses: say so, keep the rest
                            why = why_not(exc)
                    if why and rank == 0 and (op, why) not in reasons:
                        reasons.add((op, why))
                        print(f"note: no torch fused figure for {op}: {why}", flush=True)
                    calls.update({"cublas": p.gemm_torch, "iris gemm": p.gemm_iris, **p.comm_calls(arena[biggest:])})
                    t = timed(calls)
                    t = {label: t.get(label, float("nan")) for label in ("fused", "torch+nccl", "torch fused", *calls)}
                    gemm, comm = min(t["cublas"], t["iris gemm"]), min(t["nccl"], t["iris.ccl"])
                    row = {**base, "op": op, "M": M, "N": N, "K": K, **{f"{k}_us": v for k, v in t.items()},
                           "speedup": t["torch+nccl"] / t["fused"],
                           "speedup_over_torch_fused": t["torch fused"] / t["fused"],
                           "overlap_efficiency": max(gemm, comm) / t["fused"],
                           "fused_tflops": p.flops / t["fused"] / 1e6}
                    if args.profile:
                        row.update(profiled(p))
                    timeline = []
                    if args.timeline:
                        columns, timeline = timelined(p)
                        row.update(columns)
                    if args.host and gpu:
                        ctx.barrier()
                        row["fused_host_us"] = ctx.broadcast(host_us(p.fused, calls=50), src=0)
                    rows.append(row)
                    if rank == 0:
                        print(f"{op:22} {M:6} {N:6} {K:6} {t['fused']:9.1f} {t['torch+nccl']:10.1f} "
                              f"{t['torch fused']:11.1f} " + " ".join(f"{t[k]:9.1f}" for k in
                              ("cublas", "iris gemm", "nccl", "iris.ccl")) +
                              f" {row['speedup']:7.2f}x {row['speedup_over_torch_fused']:7.2f}x "
                              f"{row['overlap_efficiency']:8.2f}", flush=True)
                        if "fused_host_us" in row:
                            print(f"    host: {row['fused_host_us']:.1f} us per call", flush=True)
                        if args.profile:
                            print("    traced: " + ", ".join(f"{key} {row[f'profile_{key}_us']:.1f}" for key in
                                  ("span", *PROFILED, "idle", "tail")) +
                                  f" us per program ({row['profile_programs']} programs); a tile's compute "
                                  f"{row['profile_compute_per_tile_us']:.1f} us; median of {args.profile} calls",
                                  flush=True)
                        if timeline:
                            print(f"    timeline: span {row['timeline_span_us']:.1f}, GPU busy "
                                  f"{row['timeline_busy_us']:.1f} us; the call of median span of {args.timeline}:",
                                  flush=True)
                            print("\n".join(f"      {line}" for line in describe(timeline)), flush=True)
                        if args.profile and not row["profile_compute_us"]:
                            print("    traced: no tile's compute: the GEMM ran outside a fused kernel (torch's, "
                                  "FusedConfig.vendor_gemm, or by the chunks of matmul_all_reduce's pipeline); "
                                  "--config vendor_gemm=0,pipeline_chunks=0 profiles the fused kernel", flush=True)
                    del p
    ctx.barrier()
    if rank == 0:
        if not gpu:
            print("note: CPU backend (Triton's interpreter): a smoke test, not a figure")
        path = args.csv or default_csv("ops", gpu_name, world)
        write_csv(rows, path)
        plot(rows, path)
    for problem in problems:
        print(f"VALIDATION FAILED (rank {rank}): {problem}")
    del pads
    ctx.close()
    return 1 if problems else 0


def plot(rows, path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot skipped: matplotlib is not installed (pip install matplotlib)")
        return
    labels = [f"{r['op']}\n{r['M']}x{r['N']}x{r['K']}" for r in rows]
    fig, (speed, overlap) = plt.subplots(2, 1, figsize=(max(8, 0.55 * len(rows)), 8), sharex=True)
    x = range(len(rows))
    speed.bar(x, [r["speedup"] for r in rows], label="over torch.matmul + NCCL")
    speed.plot(x, [r["speedup_over_torch_fused"] for r in rows], "D", color="tab:red",
               label="over torch's fused op (where torch has one)")
    speed.axhline(1.0, color="k", lw=0.8)
    speed.set_ylabel("speedup of iris")
    speed.legend(fontsize=8)
    overlap.bar(x, [r["overlap_efficiency"] for r in rows], color="tab:orange")
    overlap.axhline(0.9, color="k", lw=0.8, ls="--")
    overlap.set_ylabel("overlap efficiency\nmax(T_gemm, T_comm) / T_fused")
    overlap.set_xticks(list(x), labels, rotation=90, fontsize=7)
    fig.suptitle(f"iris.ops: {rows[0]['gpu']}, {rows[0]['world_size']} ranks, commit {rows[0]['commit']}")
    out = Path(path).with_suffix(".png")
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    print(f"PNG: {out}")


if __name__ == "__main__":
    sys.exit(main())
