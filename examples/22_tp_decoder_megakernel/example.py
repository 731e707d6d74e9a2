"""A tensor-parallel decoder MLP block as one persistent kernel per rank per decode step (a megakernel).

The block is split the Megatron way: rank r holds a column shard of W_up (and of W_gate for SwiGLU), hidden x
ffn/W, the matching row shard of W_down, ffn/W x hidden, and, for the next layer's first projection, a column
shard of W_next, hidden x next/W. One decode step of T tokens (one per sequence; x, the block's normalized input,
and the residual stream are the same on every rank) is

    h        = silu(x @ W_gate[:, mine]) * (x @ W_up[:, mine])       # or silu(x @ W_up[:, mine]) (--activation silu)
    partial  = h @ W_down[mine, :]                                    # this rank's share of the block's output
    residual = residual + sum over ranks of partial                   # the all_reduce, then the residual add
    out      = residual * rsqrt(mean(residual ** 2) + eps) * weight   # RMSNorm: the next layer's input
    next_out = out @ W_next[:, mine]                                  # the next layer's first projection (--next)

Op by op that is matmuls, an all_reduce and a norm, each a launch (example 18 times such a step so, under
torch.compile and CUDA graphs). Here one kernel does all of it: its phases are separated by flags and counters it
keeps itself, never by a kernel boundary, and the host does nothing between steps (a step's call number lives in
device memory, so the launch can be captured in a CUDA graph and replayed). Four phases:

* A. Up: programs take column tiles of h round-robin (x times the up and gate shards, the activation in float32)
  and store them in a scratch on this rank. Then the rank's first barrier: every program has stored its tiles.
* B. Down and push: programs take column tiles of ``partial`` round-robin (all of h times W_down's tile) and store
  each tile into every rank's slot for this rank (the symmetric heap: peers first, then this rank's own), each
  store followed by the tile's flag on that rank, set to the call number + 1 (a block barrier, then a release
  at system scope).
* C. All-reduce and residual: for each of its tiles, a program waits until the tile's flag from every rank holds
  the call number + 1 (acquire), sums the W partial tiles in rank order (so every rank gets the same bits), adds
  the residual, stores the new residual and each row's sum of squares over the tile. Then the second barrier.
* D. Norm and next projection: every program sums the rows' squares over all tiles (in tile order), normalizes
  its tiles of ``out``, and computes its tiles of ``next_out`` from the normalized rows as it reads them.

Why it is safe:

* Programs. On a GPU the grid is one program per SM of this rank's share of the device (``--programs``
  overrides it), all resident at once: the barriers wait on every program of the launch, so nothing else may hold
  the SMs meanwhile. On the CPU (Triton's interpreter runs a launch's programs one after another) the grid is
  one program, and it never waits on a program of its own launch that has not run: its barriers count only
  itself. The flags are per tile: no wait depends on which program of a peer computes a tile.
* Call numbers. A word on this rank (``state[0]``) holds the number of calls done; every program reads it first.
  Program 0 adds one to it after the second barrier, when every program of the launch has read it (each arrived
  at that barrier after reading it); the next launch starts only after this one ends, in stream order. The
  ranks launch the same calls, so their numbers agree. Nothing is ever reset: the flags only grow, and each
  barrier's counter holds (call + 1) * programs once every program of call ``call`` has arrived.
* Barriers (one rank's programs). A program arrives by adding one to the counter (a block barrier, then a
  release at GPU scope: its stores are published) and waits until the counter reaches (call + 1) * programs
  (acquire, then a block barrier). Only this GPU reads the counter, hence GPU scope, not system scope.
* Slots. Each rank's heap holds two slots per source rank, used by call parity: call c writes slot c % 2 and
  the flags of that slot, which reach c + 1 only with call c's tiles (the same slot's previous flag was c - 1).
  A rank pushes call c's tiles into slot c % 2 of a peer only while that peer no longer reads call c - 2's tiles
  there: the pushing rank is in launch c, so its launch c - 1 ended, and that launch waited (phase C) on every
  tile of the peer's call c - 1, which the peer pushed from its launch c - 1, so the peer's launch c - 2 (every
  read of slot c % 2 in it) had ended. No rank gets two calls ahead of a peer; no acknowledgement is needed (in
  example 21 a block is read by one neighbour only and can run ahead; here every rank reads every rank's tiles
  each call). Likewise h, the row sums and the outputs are this rank's and rewritten only by its next launch.
* Progress. Phase A waits on nothing; the first barrier on this rank's phase A; phase B on nothing; phase C on
  the peers' phase B (after their first barrier, which waits only on their phase A); the second barrier on this
  rank's phase C. By induction over the phases every program of a call finishes, and over the calls every call
  does (a rank's call starts when its previous one ends), given that all programs of a launch are resident and
  that every rank launches the same calls (a rank's host waits for nothing between them).
* Limits: a call's tokens at most the ``capacity`` the buffers were made for (any T up to it, call by call, with
  the same kernel: ``tokens`` is not specialized); the counters are int64, so they do not wrap.

The ways beside it (``--benchmark``): op by op, torch matmuls + ``ctx.ccl.all_reduce`` + torch's RMSNorm, eager
and (where ranks have streams) captured in a CUDA graph, the megakernel captured too; where ranks have GPUs of
their own, the same with NCCL's all_reduce through torch.distributed.

    iris run -n 2 examples/22_tp_decoder_megakernel/example.py --validate
    iris run -n 2 examples/22_tp_decoder_megakernel/example.py --validate --benchmark --tokens 1
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
import triton
import triton.language as tl

import iris

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for examples/common
from common import utils  # noqa: E402


@triton.jit
def _mma(acc, a, b, UPCAST: tl.constexpr):
    """acc + a @ b: float32 products where the operands are float32 (not TF32), else the tensor cores'."""
    if UPCAST:  # the CPU interpreter's dot takes no 16-bit floats
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    if a.dtype == tl.float32:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _rank_barrier(counter, target, ctx):
    """Every program of this rank's launch: arrive (release), then wait until ``counter`` reaches ``target``."""
    ctx.signal(counter, 1, ctx.rank, op="add", scope="gpu")  # a block barrier first: every thread's stores
    ctx.wait_until(counter, ">=", target, scope="gpu")  # acquire, then a block barrier


@triton.jit
def _rstd(sumsq, rows, tiles, hidden, eps, BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr):
    """1 / sqrt(mean of squares + eps) per row: the tiles' sums of squares added in tile order."""
    total = tl.zeros((BLOCK_T,), tl.float32)
    chunk = tl.arange(0, BLOCK_S)
    for start in range(0, tiles, BLOCK_S):
        t = start + chunk
        total += tl.sum(tl.load(sumsq + t[:, None] * BLOCK_T + rows[None, :], mask=t[:, None] < tiles, other=0.0),
                        axis=0)
    return tl.rsqrt(total / hidden + eps)


@triton.jit(do_not_specialize=["tokens"])  # one compiled kernel for every batch size up to the capacity
def decoder_mlp(x, residual, w_up, w_gate, w_down, norm_weight, w_next, h, slots, flags, sumsq, state,
                residual_out, out, next_out, context, tokens, capacity, hidden, ffn, next_width, eps,
                RANK: tl.constexpr, WORLD: tl.constexpr, GATED: tl.constexpr, NEXT: tl.constexpr,
                PROGRAMS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_F: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, UPCAST: tl.constexpr):
    ctx = iris.DeviceContext.initialize(context, RANK, WORLD)
    pid = tl.program_id(0)
    dtype = out.dtype.element_ty
    call = tl.load(state)  # calls done before this one, on every rank alike
    rows = tl.arange(0, BLOCK_T)
    row_in = rows < tokens
    kk = tl.arange(0, BLOCK_K)
    ff = tl.arange(0, BLOCK_F)
    nn = tl.arange(0, BLOCK_N)
    up_tiles = tl.cdiv(ffn, BLOCK_F)
    tiles = tl.cdiv(hidden, BLOCK_N)  # of partial, residual and out
    # A. h = act(x @ W_up) for this program's column tiles of the shard
    for tile in range(pid, up_tiles, PROGRAMS):
        f = tile * BLOCK_F + ff
        up = tl.zeros((BLOCK_T, BLOCK_F), tl.float32)
        gate = tl.zeros((BLOCK_T, BLOCK_F), tl.float32)
        for k0 in range(0, hidden, BLOCK_K):
            k = k0 + kk
            a = tl.load(x + rows[:, None] * hidden + k[None, :], mask=row_in[:, None] & (k[None, :] < hidden),
                        other=0.0)
            w_at = k[:, None].to(tl.int64) * ffn + f[None, :]
            w_in = (k[:, None] < hidden) & (f[None, :] < ffn)
            up = _mma(up, a, tl.load(w_up + w_at, mask=w_in, other=0.0), UPCAST)
            if GATED:
                gate = _mma(gate, a, tl.load(w_gate + w_at, mask=w_in, other=0.0), UPCAST)
        if GATED:
            act = gate * tl.sigmoid(gate) * up
        else:
            act = up * tl.sigmoid(up)
        tl.store(h + rows[:, None] * ffn + f[None, :], act.to(dtype), mask=row_in[:, None] & (f[None, :] < ffn))
    _rank_barrier(state + 1, (call + 1) * PROGRAMS, ctx)  # all of h is stored
    # B. partial = h @ W_down, each tile pushed into every rank's slot for this rank, then its flag there
    parity = call % 2
    mine = slots + (parity * WORLD + RANK) * capacity * hidden  # this rank's slot, the same offset on every rank
    for tile in range(pid, tiles, PROGRAMS):
        n = tile * BLOCK_N + nn
        acc = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
        for k0 in range(0, ffn, BLOCK_K):
            k = k0 + kk
            a = tl.load(h + rows[:, None] * ffn + k[None, :], mask=row_in[:, None] & (k[None, :] < ffn), other=0.0)
            w = tl.load(w_down + k[:, None].to(tl.int64) * hidden + n[None, :],
                        mask=(k[:, None] < ffn) & (n[None, :] < hidden), other=0.0)
            acc = _mma(acc, a, w, UPCAST)
        part = acc.to(dtype)
        inside = row_in[:, None] & (n[None, :] < hidden)
        for i in tl.static_range(1, WORLD + 1):  # the peers first, this rank last
            peer = (RANK + i) % WORLD
            ctx.store(mine + rows[:, None] * hidden + n[None, :], part, peer, mask=inside)
            ctx.signal(flags + (parity * WORLD + RANK) * tiles + tile, call + 1, peer)  # release, system scope
    # C. the all-reduce of this program's tiles, as each rank's tile arrives; the residual; the rows' squares
    for tile in range(pid, tiles, PROGRAMS):
        n = tile * BLOCK_N + nn
        inside = row_in[:, None] & (n[None, :] < hidden)
        total = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
        at = rows[:, None] * hidden + n[None, :]
        for source in tl.static_range(WORLD):  # rank order: the same sum, bit for bit, on every rank
            ctx.wait_until(flags + (parity * WORLD + source) * tiles + tile, ">=", call + 1)  # acquire, system scope
            slot = slots + (parity * WORLD + source) * capacity * hidden
            total += tl.load(slot + at, mask=inside, other=0.0).to(tl.float32)
        stream = (tl.load(residual + at, mask=inside, other=0.0).to(tl.float32) + total).to(dtype)
        tl.store(residual_out + at, stream, mask=inside)
        stream = stream.to(tl.float32)
        tl.store(sumsq + tile * BLOCK_T + rows, tl.sum(stream * stream, axis=1))  # masked lanes hold zeros
    _rank_barrier(state + 2, (call + 1) * PROGRAMS, ctx)  # every tile's residual and squares are stored
    if pid == 0:  # every program of this launch has read the call number (before the barrier above)
        tl.store(state, call + 1)
    # D. RMSNorm of this program's tiles, then its tiles of the next projection, normalizing rows as it reads them
    rstd = _rstd(sumsq, rows, tiles, hidden, eps, BLOCK_T, BLOCK_S)
    for tile in range(pid, tiles, PROGRAMS):
        n = tile * BLOCK_N + nn
        inside = row_in[:, None] & (n[None, :] < hidden)
        at = rows[:, None] * hidden + n[None, :]
        stream = tl.load(residual_out + at, mask=inside, other=0.0).to(tl.float32)
        weight = tl.load(norm_weight + n, mask=n < hidden, other=0.0).to(tl.float32)
        tl.store(out + at, (stream * rstd[:, None] * weight[None, :]).to(dtype), mask=inside)
    if NEXT:
        for tile in range(pid, tl.cdiv(next_width, BLOCK_F), PROGRAMS):
            f = tile * BLOCK_F + ff
            acc = tl.zeros((BLOCK_T, BLOCK_F), tl.float32)
            for k0 in range(0, hidden, BLOCK_K):
                k = k0 + kk
                stream = tl.load(residual_out + rows[:, None] * hidden + k[None, :],
                                 mask=row_in[:, None] & (k[None, :] < hidden), other=0.0).to(tl.float32)
                weight = tl.load(norm_weight + k, mask=k < hidden, other=0.0).to(tl.float32)
                a = (stream * rstd[:, None] * weight[None, :]).to(dtype)  # the rows of out, rounded as stored
                w = tl.load(w_next + k[:, None].to(tl.int64) * next_width + f[None, :],
                            mask=(k[:, None] < hidden) & (f[None, :] < next_width), other=0.0)
                acc = _mma(acc, a, w, UPCAST)
            tl.store(next_out + rows[:, None] * next_width + f[None, :], acc.to(dtype),
                     mask=row_in[:, None] & (f[None, :] < next_width))


class Weights:
    """Whole matrices from seeds every rank shares (for the reference) and this rank's shards, on ``device``."""

    def __init__(self, hidden: int, ffn: int, next_width: int, gated: bool, rank: int, world: int, dtype, device):
        g = torch.Generator().manual_seed(2024)
        self.up = (torch.randn(hidden, ffn, generator=g) / hidden ** 0.5).to(dtype)
        self.gate = (torch.randn(hidden, ffn, generator=g) / hidden ** 0.5).to(dtype) if gated else None
        self.down = (torch.randn(ffn, hidden, generator=g) / ffn ** 0.5).to(dtype)
        self.norm = (torch.rand(hidden, generator=g) + 0.5).to(dtype)
        self.next = (torch.randn(hidden, next_width, generator=g) / hidden ** 0.5).to(dtype) if next_width else None
        cols = slice(rank * ffn // world, (rank + 1) * ffn // world)
        self.up_shard = self.up[:, cols].contiguous().to(device)
        self.gate_shard = self.gate[:, cols].contiguous().to(device) if gated else self.up_shard
        self.down_shard = self.down[cols, :].contiguous().to(device)
        self.norm_weight = self.norm.to(device)
        self.next_cols = slice(rank * next_width // world, (rank + 1) * next_width // world)
        self.next_shard = self.next[:, self.next_cols].contiguous().to(device) if next_width else self.norm_weight


def reference(x, residual, weights: Weights, eps: float):
    """The whole block in float64 on the host: (new residual, out, this rank's shard of next_out or None)."""
    x, residual = x.cpu().double(), residual.cpu().double()
    up = x @ weights.up.double()
    h = F.silu(x @ weights.gate.double()) * up if weights.gate is not None else F.silu(up)
    stream = residual + h @ weights.down.double()
    out = stream * torch.rsqrt(stream.pow(2).mean(-1, keepdim=True) + eps) * weights.norm.double()
    nxt = out @ weights.next[:, weights.next_cols].double() if weights.next is not None else None
    return stream, out, nxt


class Megakernel:
    """The buffers of the kernel for up to ``capacity`` tokens; a call launches one decode step."""

    def __init__(self, ctx, args, weights: Weights, capacity: int, ffn_shard: int, next_shard: int, dtype):
        self.ctx, self.args, self.weights = ctx, args, weights
        rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
        self.capacity, self.ffn_shard, self.next_shard, self.hidden = capacity, ffn_shard, next_shard, args.hidden
        self.tiles = -(-args.hidden // args.block_n)
        self.block_t = max(16, triton.next_power_of_2(capacity))  # tl.dot's smallest M
        work = max(-(-ffn_shard // args.block_f), self.tiles, -(-next_shard // args.block_f) if next_shard else 0)
        self.programs = utils.resident_programs(ctx, args.programs, work)
        self.h = torch.empty(capacity, ffn_shard, dtype=dtype, device=device)
        self.slots = ctx.zeros(2, world, capacity, args.hidden, dtype=dtype)  # [parity][source rank]
        self.flags = ctx.zeros(2, world, self.tiles, dtype=torch.int64)
        self.state = ctx.zeros(3, dtype=torch.int64)  # calls done, the two barriers' counters
        self.sumsq = torch.empty(self.tiles, self.block_t, dtype=torch.float32, device=device)
        self.rank, self.world = rank, world

    def __call__(self, x, residual, residual_out, out, next_out):
        tokens = x.shape[0]
        w = self.weights
        decoder_mlp[(self.programs,)](
            x, residual, w.up_shard, w.gate_shard, w.down_shard, w.norm_weight, w.next_shard, self.h, self.slots,
            self.flags, self.sumsq, self.state, residual_out, out, next_out if self.next_shard else out,
            self.ctx.get_device_context(), tokens, self.capacity, self.hidden, self.ffn_shard, self.next_shard,
            self.args.eps, RANK=self.rank, WORLD=self.world, GATED=self.args.activation == "swiglu",
            NEXT=bool(self.next_shard), PROGRAMS=self.programs, BLOCK_T=self.block_t, BLOCK_K=self.args.block_k,
            BLOCK_F=self.args.block_f, BLOCK_N=self.args.block_n,
            BLOCK_S=min(64, max(2, triton.next_power_of_2(self.tiles))),
            UPCAST=self.ctx.backend.upcasts_narrow_floats, num_warps=self.args.num_warps)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    cpu = utils.on_cpu()
    parser.add_argument("--tokens", type=int, default=5 if cpu else 8, help="tokens per step (one per sequence)")
    parser.add_argument("--hidden", type=int, default=80 if cpu else 4096, help="model width")
    parser.add_argument("--ffn", type=int, default=192 if cpu else 14336, help="MLP width over all ranks")
    parser.add_argument("--next", type=int, default=96 if cpu else 6144,
                        help="width of the next layer's first projection over all ranks (e.g. QKV); 0: none")
    parser.add_argument("--activation", default="swiglu", choices=["swiglu", "silu"],
                        help="silu(x W_gate) * x W_up, or silu(x W_up)")
    parser.add_argument("--eps", type=float, default=1e-6, help="RMSNorm's epsilon")
    parser.add_argument("--block-k", type=int, default=32 if cpu else 128, help="reduction depth per step of a tile")
    parser.add_argument("--block-f", type=int, default=32 if cpu else 64, help="columns of an up or next tile")
    parser.add_argument("--block-n", type=int, default=32, help="columns of a down (partial) tile")
    parser.add_argument("--num-warps", type=int, default=4, help="warps per program on a GPU")
    utils.add_programs_arg(parser)
    utils.add_check_and_timing_args(parser, "the activations and weights", "the op-by-op layer", runs=100, warmup=10)
    return utils.add_common_args(parser).parse_args()


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _inputs(seed: int, tokens: int, hidden: int, dtype, device):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(tokens, hidden, generator=g).to(dtype).to(device)


def _graphed(ctx, step):
    """``step`` captured in a CUDA graph (after a run outside it: compiles, makes workspaces): its replay, or the
    reason it could not be captured (on every rank alike)."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()
        stream.synchronize()
        ctx.barrier()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            step()
        torch.cuda.synchronize()
        why = ""
    except Exception as exc:  # said in the log line
        graph, why = None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''}"
    ctx.barrier()
    if not utils.all_passed(ctx, graph is not None):
        return why or "not captured on another rank"
    return graph.replay


def main(args) -> int:
    dtype = utils.torch_dtype(args.datatype)
    for name, value in (("--block-k", args.block_k), ("--block-f", args.block_f), ("--block-n", args.block_n)):
        if value < 16 or value & (value - 1):
            raise SystemExit(f"{name} {value}: a power of two, 16 or more (tl.dot's smallest tile)")
    if not 1 <= args.tokens <= 64:
        raise SystemExit(f"--tokens {args.tokens}: 1 to 64 (a decode step)")
    slots_bytes = 2 * 8 * args.tokens * args.hidden * dtype.itemsize  # per source rank, two parities: up to 8 ranks
    ctx = iris.iris(4 * slots_bytes + (4 * args.tokens * args.hidden * dtype.itemsize if args.benchmark else 0)
                    + (1 << 24))
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    for name, value in (("--ffn", args.ffn), ("--next", args.next)):
        if value % world:
            raise SystemExit(f"{name} {value}: a multiple of the {world} ranks")
    T, H = args.tokens, args.hidden
    weights = Weights(H, args.ffn, args.next, args.activation == "swiglu", rank, world, dtype, device)
    fused = Megakernel(ctx, args, weights, T, args.ffn // world, args.next // world, dtype)
    shape = f"{T} tokens, hidden {H}, ffn {args.ffn} ({args.ffn // world} per rank), {args.activation}"
    if args.next:
        shape += f", next {args.next} ({args.next // world} per rank)"
    ok = True
    if args.validate:
        calls = 3  # the slots alternate by call parity: the third call reuses the first's, flags never reset
        inputs = [(_inputs(100 + c, T, H, dtype, device), _inputs(200 + c, T, H, dtype, device)) for c in range(calls)]
        outputs = [tuple(torch.full((T, width), float("nan"), dtype=dtype, device=device)
                         for width in (H, H, args.next // world or 1)) for _ in range(calls)]
        ctx.barrier()
        for (x, residual), (residual_out, out, next_out) in zip(inputs, outputs):
            fused(x, residual, residual_out, out, next_out)  # no barrier between calls: a rank may run ahead
        ctx.barrier()
        errors = []
        for (x, residual), got in zip(inputs, outputs):
            for g, want in zip(got, reference(x, residual, weights, args.eps)):
                if want is not None:  # NaN (an element not written) fails the comparison below
                    errors.append(((g.cpu().double() - want).norm() / want.norm()).item())
        error = max(errors)
        ok = utils.all_passed(ctx, error < (1e-4 if dtype == torch.float32 else 2e-2))
        ctx.log(f"decoder MLP megakernel, {shape}, {args.datatype}, {_count(fused.programs, 'program')}, {calls} "
                f"calls: relative error {error:.2e}, validation {'passed' if ok else 'FAILED'}")
    if args.benchmark:
        x, residual = _inputs(7, T, H, dtype, device), _inputs(8, T, H, dtype, device)
        residual_out, out = torch.empty(T, H, dtype=dtype, device=device), torch.empty(T, H, dtype=dtype, device=device)
        next_out = torch.empty(T, max(1, args.next // world), dtype=dtype, device=device)
        partial, reduced = ctx.zeros(T, H, dtype=dtype), ctx.zeros(T, H, dtype=dtype)
        own_gpus = device.type == "cuda" and "nccl" in dist.get_backend()
        nccl_partial = torch.empty(T, H, dtype=dtype, device=device)
        w = weights

        def op_by_op(nccl: bool):
            def step():
                up = x @ w.up_shard
                h = F.silu(x @ w.gate_shard) * up if args.activation == "swiglu" else F.silu(up)
                if nccl:
                    torch.matmul(h, w.down_shard, out=nccl_partial)
                    dist.all_reduce(nccl_partial)
                    total = nccl_partial
                else:
                    torch.matmul(h, w.down_shard, out=partial)
                    ctx.ccl.all_reduce(reduced, partial)
                    total = reduced
                stream = residual + total
                normed = F.rms_norm(stream, (H,), w.norm_weight, args.eps)
                if args.next:
                    normed @ w.next_shard
            return step

        ways = {"megakernel": lambda: fused(x, residual, residual_out, out, next_out),
                "op by op (Iris all_reduce)": op_by_op(False)}
        if own_gpus:
            ways["op by op (NCCL all_reduce)"] = op_by_op(True)
        if ctx.backend.has_streams and device.type == "cuda":  # CUDA (or HIP) graphs
            for name in list(ways):
                ways[f"{name}, graph"] = _graphed(ctx, ways[name])
        times = {}
        for name, fn in ways.items():
            if isinstance(fn, str):
                times[name] = f"not captured ({fn})"
                continue
            ms = iris.do_bench(fn, ctx.barrier, n_warmup=args.num_warmup, n_repeat=args.num_experiments)
            times[name] = f"{ms * 1e3:.1f} us"
        if rank == 0:
            ctx.log_stats("decoder MLP block per step: " + "; ".join(f"{k} {v}" for k, v in times.items())
                          + f" ({world} ranks, {shape}, {args.datatype}, {_count(fused.programs, 'program')}"
                          + (", the CPU backend: these figures say nothing about a GPU)" if utils.on_cpu() else ")"))
    ctx.barrier()
    ctx.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(utils.run(main, parse_args()))
