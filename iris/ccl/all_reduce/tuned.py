"""The default all_reduce variant by world size, dtype and bytes per rank (iris.ccl.all_reduce).

Written by benchmarks/ccl.py (--tune after a run, or --tune-from CSV...), not by hand: at each size
measured, the fastest of one_shot, push and ll where its median time over the runs is at least
10% below two_shot's, else two_shot; a size between two measured ones takes the smaller one's variant.
The times are those replayed from a CUDA graph where the runs have them for two_shot and another variant
(the GPU's time per call), else the device ones. Runs:

    ccl_nvidia-h200_2ranks_ll_auto.csv (commit a97ffe6)
    ccl_nvidia-h200_4ranks.csv (commit 098bc0c, aa6608f)
    ccl_nvidia-h100_4ranks.csv (commit 1706a16)
    ccl_nvidia-h100_4ranks_graph.csv (commit 1706a16)
    ccl_nvidia-h200_8ranks.csv (commit 098bc0c, aa6608f)
"""

# (world size, dtype): ((below this many bytes per rank, variant), ...); two_shot past the last entry.
ALL_REDUCE = {
    (2, 'bf16'): (
        (524288, 'll'),
        (4611686018427387904, 'push'),
    ),
    (4, 'bf16'): (
        (131072, 'll'),
    ),
    (8, 'bf16'): (
        (4096, 'one_shot'),
        (8192, 'two_shot'),
        (16384, 'one_shot'),
        (32768, 'two_shot'),
        (262144, 'one_shot'),
    ),
}
