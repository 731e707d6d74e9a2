"""Plugins shared by the test and conformance suites.

- iris.testing.cross_compile_plugin: ``--cross-compile cuda:90,hip:gfx942`` (default: IRIS_CROSS_COMPILE)
  compiles every kernel the CPU backend launches for those GPU targets before running it, and fails the
  test whose kernel does not compile; the session ends with a count of what was compiled per target.
- iris.testing.heap_refusals: under ``IRIS_HEAP``, a test whose job that heap provider refuses is skipped with
  the refusal.
- iris.testing.failure_log: with ``IRIS_FAILURE_LOG``, each failing test is named in that file as it fails.
"""

pytest_plugins = ("iris.testing.cross_compile_plugin", "iris.testing.heap_refusals", "iris.testing.failure_log")
