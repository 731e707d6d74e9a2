"""Tensor-parallel MLP decode under torch.compile and CUDA graphs, its all-reduce by Iris, NCCL and torch symmetric
memory side by side.

The block is split the Megatron way: each rank holds a column slice of the up projection (hidden x ffn / W)
and the matching row slice of the down projection (ffn / W x hidden). One decode step of a batch of tokens
(one per sequence) is

    partial = silu(rms_norm(x) @ W_up[:, mine]) @ W_down[mine, :]   # this rank's share: no communication
    x = x + all_reduce(partial)                                      # the sum over ranks, added to the residual

The programs differ only in the all-reduce: ``torch.ops.iris.all_reduce`` (iris, after
``iris.compile.set_context``), torch.distributed's functional ``all_reduce`` (nccl) and torch symmetric memory's
``one_shot_all_reduce_copy`` (symm_mem). Each step is compiled once with ``torch.compile(fullgraph=True,
dynamic=True)`` (one graph for every batch size), captured in
a CUDA graph and the graph replayed once per token, its output fed back as the next input. Printed per batch
size: the median time per token of each and Iris's speed-up over the faster other. ``--validate`` checks one
step of each against a float32 reference with the whole weights.

On the CPU backend (no CUDA graphs: the compiled step is called) the NCCL column is gloo and symmetric memory
is not there; several ranks on one GPU (IRIS_SIMULATION=1) have neither NCCL nor symmetric memory.

    iris run -n 2 examples/18_tp_mlp_decode/example.py --validate
    python examples/18_tp_mlp_decode/example.py --hidden 8192 --batch 1 8 64
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import iris

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for examples/common
from common import utils  # noqa: E402

PATHS = ("iris", "nccl", "symm_mem")


def parse_args():
    cpu = utils.on_cpu()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--hidden", type=int, default=64 if cpu else 4096, help="model width")
    parser.add_argument("--ffn", type=int, default=None, help="MLP width over all ranks (default 4 x hidden)")
    parser.add_argument("--batch", type=int, nargs="+", default=[3] if cpu else [1, 2, 4, 8, 16, 32, 64],
                        help="tokens per step (one per sequence)")
    parser.add_argument("--datatype", default="bf16", choices=["fp16", "bf16"], help="element type")
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS, help="the all-reduces to run")
    parser.add_argument("--steps", type=int, default=2 if cpu else 200, help="tokens decoded per timed run")
    parser.add_argument("--runs", type=int, default=1 if cpu else 5, help="timed runs per point (median)")
    parser.add_argument("-v", "--validate", action="store_true", help="check a step of each against float32")
    return utils.add_common_args(parser).parse_args()


class Weights:
    """This rank's slices of W_up and W_down, from a seed every rank shares (so each can build the whole
    matrices for the reference)."""

    def __init__(self, hidden: int, ffn: int, rank: int, world: int, dtype, device):
        if ffn % world:
            raise SystemExit(f"--ffn {ffn} must divide over {world} ranks")
        self.full_up, self.full_down = self.whole(hidden, ffn, dtype, device)
        mine = slice(rank * ffn // world, (rank + 1) * ffn // world)
        self.up = self.full_up[:, mine].contiguous()
        self.down = self.full_down[mine, :].contiguous()

    @staticmethod
    def whole(hidden: int, ffn: int, dtype, device):
        g = torch.Generator(device=device).manual_seed(2024)
        up = torch.randn(hidden, ffn, generator=g, device=device) / hidden ** 0.5
        down = torch.randn(ffn, hidden, generator=g, device=device) / ffn ** 0.5
        return up.to(dtype), down.to(dtype)


def all_reduces(ctx, paths, capacity: int, device):
    """{path: the all-reduce it compiles, or the reason it cannot run here}."""
    chosen = {}
    iris.compile.set_context(ctx)
    for path in paths:
        if path == "iris":
            chosen[path] = lambda t: torch.ops.iris.all_reduce(t, "sum")
        elif path == "nccl":
            if device.type == "cuda" and "nccl" not in dist.get_backend():  # e.g. "cpu:gloo,cuda:nccl" holds it
                chosen[path] = f"the process group is {dist.get_backend()}, not NCCL (several ranks on one GPU)"
                continue
            from torch.distributed import _functional_collectives as funcol

            group = dist.group.WORLD
            chosen[path] = lambda t: funcol.all_reduce(t, "sum", group)
        else:
            chosen[path] = symm_mem_all_reduce(capacity, device)
    return chosen


def symm_mem_all_reduce(capacity: int, device):
    """torch symmetric memory's one-shot all-reduce from a buffer rendezvoused once, or why it cannot run."""
    if device.type != "cuda" or torch.cuda.device_count() < dist.get_world_size():
        return "torch symmetric memory needs one GPU per rank"
    try:
        import torch.distributed._symmetric_memory as symm_mem

        group_name = dist.group.WORLD.group_name
        buffer = symm_mem.empty(capacity, dtype=torch.uint8, device=device)
        symm_mem.rendezvous(buffer, group_name)
    except Exception as exc:  # a torch without it: said in the table
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"

    def all_reduce(t):
        view = buffer[: t.numel() * t.element_size()].view(t.dtype).view(t.shape)
        return torch.ops.symm_mem.one_shot_all_reduce_copy(view, t, "sum", group_name)

    return all_reduce


def make_step(weights: Weights, all_reduce):
    def step(x):
        h = torch.nn.functional.rms_norm(x, (x.shape[-1],))
        partial = torch.nn.functional.silu(h @ weights.up) @ weights.down
        return x + all_reduce(partial)

    return step


def reference(x: torch.Tensor, weights: Weights) -> torch.Tensor:
    """One step with the whole weights in float32 (no communication)."""
    x32 = x.float()
    h = torch.nn.functional.rms_norm(x32, (x32.shape[-1],)).to(x.dtype).float()
    return x32 + torch.nn.functional.silu(h @ weights.full_up.float()) @ weights.full_down.float()


def compiled(step):
    """``torch.compile(step, fullgraph=True, dynamic=True)``, one compilation for every batch size, after a reset of
    dynamo's caches: every step here is the same code with other weights and another all-reduce, and past
    dynamo's recompile limit (8) a function runs eagerly without a word."""
    torch._dynamo.reset()
    return torch.compile(step, fullgraph=True, dynamic=True)


class Decoder:
    """A compiled step and, on a GPU, its CUDA graph for ``x``'s shape; :meth:`tokens` decodes ``steps`` tokens
    from ``x``."""

    def __init__(self, compiled_step, x: torch.Tensor):
        self.compiled = compiled_step
        self.x = x.clone()
        self.graph = None
        if x.is_cuda:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # compile and warm up outside the capture
                for _ in range(3):
                    self.compiled(self.x)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.x.copy_(self.compiled(self.x))
        else:
            self.compiled(self.x)  # compiles

    def tokens(self, steps: int) -> None:
        for _ in range(steps):
            if self.graph is not None:
                self.graph.replay()
            else:
                self.x.copy_(self.compiled(self.x))


def seconds_per_token(ctx, decoder: Decoder, steps: int, runs: int) -> float:
    times = []
    for _ in range(runs):
        ctx.barrier()
        if decoder.graph is not None:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            decoder.tokens(steps)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / steps)
        else:
            began = time.perf_counter()
            decoder.tokens(steps)
            times.append((time.perf_counter() - began) / steps)
    return statistics.median(times)


def main(args) -> int:
    dtype = utils.torch_dtype(args.datatype)
    ffn = args.ffn or 4 * args.hidden
    ctx = iris.iris(1 << 26 if utils.on_cpu() else 1 << 30)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    weights = Weights(args.hidden, ffn, rank, world, dtype, device)
    capacity = max(args.batch) * args.hidden * dtype.itemsize
    paths = all_reduces(ctx, args.paths, capacity, device)
    ok = True
    rows = {batch: {} for batch in args.batch}
    for path, all_reduce in paths.items():
        if isinstance(all_reduce, str):
            continue
        step = compiled(make_step(weights, all_reduce))
        for batch in args.batch:
            g = torch.Generator(device=device).manual_seed(batch)
            x0 = torch.randn(batch, args.hidden, generator=g, device=device).to(dtype)
            if args.validate:
                want = reference(x0, weights)
                error = ((step(x0).float() - want).norm() / want.norm()).item()
                good = error <= 3e-2
                (ctx.log if good else ctx.error)(f"batch {batch}, {path}: relative error {error:.1e}: "
                                                 f"{'passed' if good else 'FAILED'}")
                ok &= good
            rows[batch][path] = seconds_per_token(ctx, Decoder(step, x0), args.steps, args.runs)
    rows = [(batch, {path: row.get(path) for path in paths}) for batch, row in rows.items()]
    if rank == 0:
        report(ctx, args, ffn, world, paths, rows)
    if args.validate:
        ok = utils.all_passed(ctx, ok)
    ctx.barrier()
    ctx.close()
    return 0 if ok else 1


def label(path: str) -> str:
    """A column's name: torch.distributed's column is named for its backend (gloo on the CPU)."""
    return path if path != "nccl" or "nccl" in dist.get_backend() else dist.get_backend()


def report(ctx, args, ffn: int, world: int, paths: dict, rows) -> None:
    how = "torch.compile + CUDA graphs" if not utils.on_cpu() else "torch.compile on the CPU backend"
    lines = [f"TP MLP decode: hidden {args.hidden}, ffn {ffn} ({ffn // world} per rank), {args.datatype}, {world} "
             f"ranks, {how}: us per token (median of {args.runs} runs of {args.steps} tokens)",
             "batch " + "".join(f"{label(path):>12}" for path in paths) + "   iris vs the faster other"]
    for batch, row in rows:
        cells = "".join(f"{'-' if row[p] is None else f'{row[p] * 1e6:.1f}':>12}" for p in paths)
        others = [row[p] for p in paths if p != "iris" and row[p] is not None]
        ratio = f"{min(others) / row['iris']:.2f}x" if others and row.get("iris") else "-"
        lines.append(f"{batch:>5} {cells}   {ratio}")
    lines += [f"{label(path)}: not run: {why}" for path, why in paths.items() if isinstance(why, str)]
    if utils.on_cpu():
        lines.append("(the CPU backend: Triton's interpreter; these figures say nothing about a GPU)")
    ctx.log_stats("\n".join(lines))


if __name__ == "__main__":
    sys.exit(utils.run(main, parse_args()))
