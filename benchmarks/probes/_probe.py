"""What the small-call probes share (eager_probe.py, host_path_probe.py): their arguments and their context."""

import argparse

import iris


def start(doc: str, refusal: str, **options: int) -> tuple[argparse.Namespace, object]:
    """The probe's arguments (``--bytes`` per rank, default 4 and 64 KiB, and an int option per ``options``
    item, name -> default) and its context (a 64 MiB heap). A GPU probe: on the CPU backend it exits saying
    ``refusal``.

    Example:
        >>> args, ctx = start(__doc__, "nothing to time", iters=30, warmup=5)
    """
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--bytes", type=int, nargs="+", default=[4096, 65536])
    for name, default in options.items():
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    ctx = iris.iris(1 << 26)
    if ctx.backend.name == "cpu":
        raise SystemExit(f"a GPU probe: {refusal}")
    return args, ctx
