"""tvm: Apache TVM (Relax) from the ONNX export, tuned with MetaSchedule.

The package follows the compile's own steps: :mod:`.target` (the host CPU or CUDA as TVM
sees it), :mod:`.onnx_import`, :mod:`.build` (fuse, tune, apply the database, build),
:mod:`.tuning` (MetaSchedule within a budget, and what is patched into it),
:mod:`.database` (tuning databases reused and cached), :mod:`.measurers` (the builder and
runner pools), :mod:`.engine` (run, save, load) and :mod:`.compiler` (the registry entry);
:mod:`.settings` holds the constants.

The model is imported with ``relax.frontend.onnx.from_onnx`` at a static batch shape, its
operators are fused into TIR functions, and MetaSchedule tunes those functions within a trial
budget. The tuning database (MetaSchedule's JSON workload and record files) is part of the
engine: it is saved next to the built library and reused, so a second compile of the same model,
target and batch size spends no trials.

Where tuning time went, and what this module does instead (numbers in ``docs/tvm.md``):

- TVM's ``LocalBuilder`` starts a fresh pool of worker processes for every round of
  candidates, and every worker imports ``tvm`` (~4 s) and then ``tvm.s_tir.tensor_intrin``
  (~28 s: it parses every CUDA, ROCm, Hexagon and Arm tensor intrinsic) before its first build;
  with its 30 s timeout every build on a 2-core host timed out. Here one pool of build workers
  lives for the whole process, starts in the background while the model is exported, never
  imports the intrinsics (candidates reach the builder already scheduled and tensorized), and
  links each candidate in the parallel builder instead of the serial runner.
- ``TuneContext`` imports the same intrinsics once in the main process; only the target's own
  intrinsic module is registered here (~1 s).
- The XGBoost cost model scores nothing until it has 100 measurements, yet TVM retrains it after
  every round; it is not trained before then, and budgets below that count use a plain random
  search instead of evolving a population on random scores.
- TVM's thread pool, left to itself on this VM, runs one thread and pins the process to core 0:
  ``TVM_NUM_THREADS`` is set to the physical core count before it starts.

Versions: apache-tvm 0.27.0.post1 with apache-tvm-ffi pinned to 0.1.14.post0, because 0.1.15.post2
(the version pip pairs with TVM 0.27) segfaults in every JSON serialization (``tvm.ir.save_json``),
which MetaSchedule uses to ship every candidate to the builder and to write its database.
"""

from mlflow_ngraph.compilers.tvm.compiler import TvmCompiler
from mlflow_ngraph.compilers.tvm.engine import TvmEngine
from mlflow_ngraph.compilers.tvm.target import host_cpu_target_spec, physical_cores

__all__ = ["TvmCompiler", "TvmEngine", "host_cpu_target_spec", "physical_cores"]
