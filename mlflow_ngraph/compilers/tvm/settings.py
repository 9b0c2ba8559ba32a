"""Settings of the TVM compiler: file names of an engine, tuning budgets and timeouts, the
x86 ISA flags a generated kernel may use."""

from __future__ import annotations

ENGINE_FORMAT = "tvm-relax-vm"
LIBRARY_FILE = "model.so"
PARAMS_FILE = "params.bin"
MANIFEST_FILE = "tvm_engine.json"
DATABASE_DIR = "database"
WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"

#: Default total trial budget. A judgement call on cost: MetaSchedule needs hundreds of trials
#: per task to converge (the paper used up to 1500), but a trial still costs 1-4 s of search,
#: build and measurement on a shared 2-core host after the overhead cuts here, so 64 keeps a
#: compile to minutes; it took a 64-channel conv block from 24x slower than PyTorch eager
#: (untuned) to about its speed, still ~3x behind ONNX Runtime (docs/tvm.md).
DEFAULT_TRIALS = 64
#: MetaSchedule's own batch size per search round; smaller budgets use smaller rounds so that the
#: first round-robin pass reaches every task (with 64 a 64-trial budget would all go to task 0).
MAX_TRIALS_PER_ROUND = 64
#: Evolutionary-search population once the cost model is trained. MetaSchedule's default is 512;
#: each round samples, mutates and scores the whole population, which costs seconds per round on
#: 2 cores. We use 8 of population per trial of a task's budget, clamped to [64, 512] (a judgement
#: call: small budgets cannot exploit a big population, and 64 still keeps the search diverse).
POPULATION_PER_TRIAL = 8
MIN_POPULATION, MAX_POPULATION = 64, 512
#: Random-search population per candidate of a round, for budgets the cost model never sees
#: trained (see ``_search_settings``): twice what a round measures leaves room for duplicates.
RANDOM_POPULATION_PER_CANDIDATE, MIN_RANDOM_POPULATION = 2, 16
#: Seconds a single candidate may take to build. TVM's default (30 s) included the ~30 s of
#: imports in every fresh worker and so killed every build on a 2-core host; with warm workers a
#: build takes about a second, and 60 s leaves room for a heavily unrolled candidate.
BUILD_TIMEOUT_S = 60.0
#: Seconds a single candidate may take to run its measurement (3 runs, at least 100 ms).
RUN_TIMEOUT_S = 60.0
#: Builds a worker process serves before it is replaced: TVM restarts its pool after every batch
#: because of a memory leak in long-lived workers; recycling every 64 builds bounds the leak
#: while paying the worker start-up (~4 s) once per 64 candidates instead of per batch.
WORKER_MAX_USES = 64
#: Seed of the search, so that two tunings with the same budget explore the same candidates.
SEARCH_SEED = 0
#: Bump when the cached-database key or layout changes.
CACHE_VERSION = 1

#: x86 ISA extensions that matter for generated kernels: LLVM's name -> the /proc/cpuinfo flag.
#: LLVM derives the features from the CPU name (``-mcpu``); a hypervisor may hide some of them,
#: so those missing from /proc/cpuinfo are switched off to avoid illegal instructions.
X86_ISA_FLAGS = {
    "sse3": "pni",
    "ssse3": "ssse3",
    "sse4.1": "sse4_1",
    "sse4.2": "sse4_2",
    "avx": "avx",
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
    "bmi": "bmi1",
    "bmi2": "bmi2",
    "avx512f": "avx512f",
    "avx512bw": "avx512bw",
    "avx512cd": "avx512cd",
    "avx512dq": "avx512dq",
    "avx512vl": "avx512vl",
    "avx512ifma": "avx512ifma",
    "avx512vbmi": "avx512vbmi",
    "avx512vbmi2": "avx512_vbmi2",
    "avx512vnni": "avx512_vnni",
    "avx512bitalg": "avx512_bitalg",
    "avx512vpopcntdq": "avx512_vpopcntdq",
    "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16",
    "avxvnni": "avx_vnni",
    "amx-tile": "amx_tile",
    "amx-int8": "amx_int8",
    "amx-bf16": "amx_bf16",
    "gfni": "gfni",
    "vaes": "vaes",
    "vpclmulqdq": "vpclmulqdq",
}
