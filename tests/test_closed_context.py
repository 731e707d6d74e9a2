"""A closed context refuses every call before any launch, with a message, whether the call was planned (replayed)
before the close or is new: its peers' heaps are unmapped, so a launch would fault (it crashed the process)."""

import iris


def _calls_after_close():
    ctx = iris.iris(1 << 20)
    x, out = ctx.full((64,), 1.0), ctx.zeros(64)
    gathered = ctx.zeros(64 * ctx.get_num_ranks())
    for _ in range(3):  # planned, then replayed
        ctx.ccl.all_reduce(out, x)
    ctx.close()
    calls = {"a replayed all_reduce": lambda: ctx.ccl.all_reduce(out, x),
             "a first all_gather": lambda: ctx.ccl.all_gather(gathered, x),
             "device_barrier": lambda: ctx.device_barrier(),
             "ccl.barrier": lambda: ctx.ccl.barrier(),
             "zeros": lambda: ctx.zeros(4)}
    refused = {}
    for what, call in calls.items():
        try:
            call()
            refused[what] = None
        except RuntimeError as error:
            refused[what] = str(error)
    return refused, out[:2].tolist(), ctx.get_num_ranks()


def test_every_call_on_a_closed_context_is_refused_before_any_launch(ranks):
    for refused, out, world in ranks.run(_calls_after_close):
        assert out == [float(world)] * 2
        for what, message in refused.items():
            assert message is not None and "this Iris context is closed" in message, (what, message)
            assert "iris.iris()" in message, (what, message)

