"""Deploying the engine that was measured: choose it, pull it verified, load it, register it.

- :mod:`.select`: the best valid cell of a device and model by a metric, under constraints,
  read from the results indexes (as ``compare`` reads them).
- :mod:`.pull`: the cell's ``engines/bs<b>`` artifact downloaded, every file checked against
  its manifest (size and sha256), then moved into place.
- :mod:`.engine`: :func:`load_engine` runs a pulled engine with the runtime that built it,
  after checking this host can (runtime version, CPU, GPU).
- :mod:`.register`: the engine as an MLflow logged model (data, loaded by the installed
  :mod:`.pyfunc_model`), a registered model version and an alias per device.
- :mod:`.registered`: a registered engine checked against its version before MLflow loads
  or serves it.
- :mod:`.trust`: what an engine from a shared store must prove (docs/security.md).
"""
