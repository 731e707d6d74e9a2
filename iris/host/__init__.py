"""Host sides of device features: the device barrier's launches (:mod:`iris.host.barrier`, beside
:mod:`iris.device.barrier`) and tracing's enable/export (:mod:`iris.host.tracing`, beside
:mod:`iris.device.tracing`). Host code only; kernels and device functions live in :mod:`iris.device`."""
