"""Helpers of the numbered examples: start the ranks (with or without a launcher), datatypes, the
rank-dependent data the examples move and check, and the bandwidth table of 00-05."""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import iris
from iris.runtime import interpreted
from iris.runtime.distributed import launch

DTYPES = {"int8": torch.int8, "fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32,
          "int32": torch.int32}


def on_cpu() -> bool:
    """True on the CPU backend (Triton's interpreter): the examples pick small default sizes there."""
    return interpreted()


def hopper_or_newer() -> bool:
    """True on an NVIDIA GPU of compute capability 9.0 or newer (TMA tensor descriptors), not on the CPU backend."""
    return (not interpreted() and torch.cuda.is_available() and torch.version.hip is None
            and torch.cuda.get_device_capability()[0] >= 9)


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a ``--datatype`` name (int8, fp16, bf16, fp32)."""
    if name not in DTYPES:
        raise SystemExit(f"unknown --datatype {name!r}: choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


def add_check_and_timing_args(parser: argparse.ArgumentParser, what: str, against: str, runs: int = 100,
                              warmup: int = 10) -> argparse.ArgumentParser:
    """The newer examples' flags: --datatype (of ``what``; fp32 on the CPU backend, else bf16), -v/--validate,
    --benchmark (beside ``against``), --num_experiments and --num_warmup (``runs`` and ``warmup`` on a GPU)."""
    cpu = on_cpu()
    parser.add_argument("--datatype", default="fp32" if cpu else "bf16", choices=["fp16", "bf16", "fp32"],
                        help=f"element type of {what}")
    parser.add_argument("-v", "--validate", action="store_true", help="check against torch; exit non-zero if wrong")
    parser.add_argument("--benchmark", action="store_true", help=f"time it beside {against}")
    parser.add_argument("--num_experiments", type=int, default=2 if cpu else runs, help="timed runs")
    parser.add_argument("--num_warmup", type=int, default=1 if cpu else warmup, help="untimed runs first")
    return parser


def timed_ms(ctx, args, *calls) -> list[float]:
    """Milliseconds per run of each of ``calls`` by ``iris.do_bench`` (the ranks lined up by ``ctx.barrier``
    before each run; ``args.num_warmup`` untimed runs, then ``args.num_experiments`` timed): the examples' way of
    timing a fused kernel beside the torch way.

    Example: ``fused_ms, torch_ms = timed_ms(ctx, args, fused, torch_way)``."""
    return [iris.do_bench(call, ctx.barrier, n_warmup=args.num_warmup, n_repeat=args.num_experiments)
            for call in calls]


class BaselineAllGather:
    """The torch way's all_gather in the examples' baselines: ``gather(whole, part)`` stacks every rank's ``part``
    (one shape and dtype on every rank) into ``whole`` (W x part's shape), by NCCL through torch.distributed where
    each rank has a GPU of its own, else by Iris through heap buffers made here (gloo takes no device tensors,
    and simulated ranks share a GPU). ``name`` says which, for the log line.

    Example: ``gather = BaselineAllGather(ctx, keys)``, then ``gather(whole_keys, keys)`` inside the timed call."""

    def __init__(self, ctx, part: torch.Tensor):
        self.ctx = ctx
        self.nccl = part.device.type == "cuda" and "nccl" in dist.get_backend()
        self.name = "NCCL" if self.nccl else "Iris"
        if not self.nccl:
            self.heap_in = ctx.zeros(part.numel(), dtype=part.dtype)
            self.heap_out = ctx.zeros(ctx.get_num_ranks() * part.numel(), dtype=part.dtype)

    def __call__(self, whole: torch.Tensor, part: torch.Tensor) -> None:
        if self.nccl:
            dist.all_gather_into_tensor(whole, part)
            return
        self.heap_in.copy_(part.reshape(-1))
        self.ctx.ccl.all_gather(self.heap_out, self.heap_in)
        whole.copy_(self.heap_out.view(whole.shape))


def add_programs_arg(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """--programs of a persistent kernel whose programs wait on each other: see :func:`resident_programs`."""
    parser.add_argument("--programs", type=int, default=0,
                        help="programs of the launch (0: one per SM of this rank's share of its GPU; 1 on the CPU); "
                             "all must be resident at once")
    return parser


def resident_programs(ctx, asked: int, work: int) -> int:
    """Programs of a launch whose programs wait on each other (or on peers' programs), the same on every rank:
    all must run at once, so one where the backend runs a launch's programs in turn, else ``asked`` or one per SM
    of this rank's share of its GPU; at most ``work``.

    Raises:
        SystemExit: ``asked`` > 1 where programs run in turn (one would wait on a program that has not run).
    """
    if asked > 1 and ctx.backend.runs_programs_in_turn:
        raise SystemExit(f"--programs {asked}: this backend runs a launch's programs one after another, and a "
                         "program would wait on a program that has not run: leave it at 0 (one program)")
    if asked:
        mine = asked
    elif ctx.backend.runs_programs_in_turn:
        mine = 1
    else:
        sharing = -(-ctx.get_num_ranks() // max(1, ctx.backend.device_count()))  # ranks per GPU in simulation
        mine = max(1, ctx.get_cu_count() // sharing)
    return min([work] + [ctx.broadcast(mine, r) for r in range(ctx.get_num_ranks())])


def seeded(seed: int, shape, dtype: torch.dtype) -> torch.Tensor:
    """Normal samples of ``shape`` from ``seed`` (the same on every rank), as ``dtype``, on the host."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def add_common_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags every example has: -r/--num_ranks (ranks to spawn when no launcher started them)."""
    parser.add_argument("-r", "--num_ranks", type=int, default=2,
                        help="ranks to spawn when no launcher (iris run, torchrun, mpirun) started the script")
    return parser


def bandwidth_args(doc: str, datatype: str = "fp16", choices=("int8", "fp16", "bf16", "fp32")) -> argparse.Namespace:
    """The flags of the data-movement examples (00-05), with the original's short names; small defaults
    on the CPU backend."""
    cpu = on_cpu()
    parser = argparse.ArgumentParser(description=doc.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("-t", "--datatype", default=datatype, choices=list(choices), help="element type")
    parser.add_argument("-z", "--buffer_size", type=int, default=1 << 14 if cpu else 1 << 30, help="bytes per buffer")
    parser.add_argument("-b", "--block_size", type=int, default=1024 if cpu else 512, help="elements per program")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every measurement")
    parser.add_argument("-d", "--validate", action="store_true", help="check every result; exit non-zero if wrong")
    parser.add_argument("-p", "--heap_size", type=int, default=None, help="heap bytes (default: what the buffers need)")
    parser.add_argument("-o", "--output_file", default="", help="write the bandwidth matrix to this .json file")
    parser.add_argument("-n", "--num_experiments", type=int, default=2 if cpu else 10, help="timed runs")
    parser.add_argument("-w", "--num_warmup", type=int, default=1, help="untimed runs before them")
    return add_common_args(parser).parse_args()


def all_passed(ctx, ok: bool) -> bool:
    """True on every rank when ``ok`` is true on every rank."""
    return all(ctx.broadcast(bool(ok), r) for r in range(ctx.get_num_ranks()))


def every_pair(ctx, args, label: str, bench_pair, what: str) -> int:
    """Run ``bench_pair(source_rank, destination_rank) -> (GiB/s, ok)`` for every ordered pair of ranks, print
    the bandwidth matrix under ``label``, report the validation of ``what`` and close ``ctx``; the exit code."""
    world = ctx.get_num_ranks()
    matrix = torch.zeros(world, world)
    ok = True
    for source_rank in range(world):
        for destination_rank in range(world):
            matrix[source_rank, destination_rank], pair_ok = bench_pair(source_rank, destination_rank)
            ok &= pair_ok
    print_bandwidth_matrix(ctx, matrix, label, args.output_file)
    if args.validate:
        ok = all_passed(ctx, ok)
        ctx.log(f"validation {'passed' if ok else 'FAILED'}: every pair of {world} ranks, {what}")
    ctx.barrier()
    ctx.close()
    return 0 if ok or not args.validate else 1


def pattern(n: int, rank: int, dtype: torch.dtype, device) -> torch.Tensor:
    """``n`` values that say which rank they came from, exact in every dtype (int8 included):
    ``i % 61 + 3 * rank + 1``, never zero."""
    return (torch.arange(n, device=device) % 61 + 3 * rank + 1).to(dtype)


def check(ctx, what: str, got: torch.Tensor, want: torch.Tensor) -> bool:
    """Compare exactly (data movement and integer atomics are exact); log the first mismatch."""
    wrong = (got != want).nonzero()
    if len(wrong) == 0:
        return True
    first = tuple(wrong[0].tolist())
    ctx.error(f"{what}: {len(wrong)} of {got.numel()} elements wrong; first at {first}: "
              f"got {got[first].item()}, expected {want[first].item()}")
    return False


def bytes_to_elements(buffer_size: int, dtype: torch.dtype) -> int:
    return max(1, buffer_size // torch.tensor([], dtype=dtype).element_size())


def print_bandwidth_matrix(ctx, matrix: torch.Tensor, label: str, output_file: str = "") -> None:
    """Rank 0 prints the (source, destination) matrix in GiB/s and, with ``-o x.json``, writes it as JSON."""
    if ctx.get_rank() != 0:
        return
    world = matrix.shape[0]
    lines = [label, "SRC\\DST".ljust(11) + "".join(f"rank {d:02d}".rjust(11) for d in range(world))]
    lines += [f"rank {s:02d} ->".ljust(11) + "".join(f"{matrix[s, d]:11.4g}" for d in range(world))
              for s in range(world)]
    if on_cpu():
        lines.append("(the CPU backend: Triton's interpreter; these figures say nothing about a GPU)")
    ctx.log_stats("\n".join(lines))
    if output_file:
        if not output_file.endswith(".json"):
            raise SystemExit(f"-o/--output_file {output_file!r}: only .json is written")
        rows = [{"source_rank": s, "destination_rank": d, "bandwidth_gbps": float(matrix[s, d])}
                for s in range(world) for d in range(world)]
        with open(output_file, "w") as f:
            json.dump(rows, f, indent=2)


def print_bandwidth_vector(ctx, gbps: float, label: str, output_file: str = "") -> None:
    """Every rank's figure, gathered on rank 0, which prints them (and writes them as JSON with ``-o``)."""
    figures = [ctx.broadcast(gbps, r) for r in range(ctx.get_num_ranks())]
    if ctx.get_rank() != 0:
        return
    lines = [label] + [f"rank {r:02d}: {g:10.4g}" for r, g in enumerate(figures)]
    if on_cpu():
        lines.append("(the CPU backend: Triton's interpreter; these figures say nothing about a GPU)")
    ctx.log_stats("\n".join(lines))
    if output_file:
        if not output_file.endswith(".json"):
            raise SystemExit(f"-o/--output_file {output_file!r}: only .json is written")
        with open(output_file, "w") as f:
            json.dump([{"rank": r, "bandwidth_gbps": g} for r, g in enumerate(figures)], f, indent=2)


def launched() -> bool:
    """True when a launcher started this process as one rank of a job (iris run, torchrun, mpirun, srun; a
    batch script's plain ``python`` is none, see iris.runtime.distributed.launch)."""
    return "RANK" in os.environ or launch().launcher != "solo"


def _spawned(rank: int, world: int, port: int, main, args, statuses) -> None:
    # The original's examples start their ranks this way: one process each, then init_process_group.
    iris.set_logger_level(iris.INFO)  # a spawned process starts afresh
    # NCCL refuses two ranks on one GPU (IRIS_SIMULATION=1): gloo there and on the CPU, as Iris's own bootstrap.
    gpus = 0 if iris.runtime.SELECTED == "cpu" else torch.cuda.device_count()
    if gpus < world:
        dist.init_process_group(backend="gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
    else:
        dist.init_process_group(backend="cpu:gloo,cuda:nccl", rank=rank, world_size=world,
                                init_method=f"tcp://127.0.0.1:{port}", device_id=torch.device("cuda", rank))
    try:
        statuses[rank] = main(args)
    finally:
        dist.destroy_process_group()


def run(main, args) -> int:
    """Run ``main(args)`` (its exit status) on every rank: directly under a launcher, else in
    ``args.num_ranks`` processes spawned here. Returns the worst status."""
    iris.set_logger_level(iris.INFO)  # ctx.log and ctx.log_stats lines are the examples' output
    if launched():
        return main(args)
    from iris.launch import free_port

    statuses = mp.Manager().list([1] * args.num_ranks)
    mp.spawn(_spawned, args=(args.num_ranks, free_port(), main, args, statuses), nprocs=args.num_ranks, join=True)
    return max(statuses)
