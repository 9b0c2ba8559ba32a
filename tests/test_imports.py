import os
import subprocess
import sys

import pytest

HEAVY = ("openvino", "onnxruntime", "tvm", "tensorrt", "pynvml", "ray")


def test_importing_the_package_and_cli_imports_no_compiler_runtime():
    code = (
        "import sys, mlflow_ngraph, mlflow_ngraph.commands.cli, mlflow_ngraph.compilers.registry, "
        "mlflow_ngraph.run.runner\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}
    )
    assert done.returncode == 0, done.stderr
    return done


#: ONNX Runtime's availability check imports it (a broken install is refused up front, ~30 ms)
NOT_ON_A_RESUME = ("torch", "timm", "torchvision", "onnx", "openvino", "tvm", "tensorrt")


@pytest.mark.e2e
def test_a_rerun_with_every_cell_journaled_imports_no_runtime(tmp_path, tracking_uri):
    """Time to result: a re-run that has nothing to measure imports neither the model
    libraries (timm, torch) nor any compiler runtime."""
    args = [
        "benchmark",
        "--model",
        "conv_block:width=8,depth=1,image_size=32",
        "--model",
        "resnet18",
        "--compiler",
        "identity",
        "--compiler",
        "onnxruntime",
        "--batch-sizes",
        "1",
        "--warmup",
        "0",
        "--repetitions",
        "1",
        "--min-duration",
        "0",
        "--home",
        str(tmp_path / "home"),
        "--tracking-uri",
        tracking_uri,
        "-q",
    ]
    code = (
        "import sys\n"
        "from mlflow_ngraph.commands.cli import main\n"
        "try:\n"
        f"    main({args!r})\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        f"print([m for m in {NOT_ON_A_RESUME!r} if m in sys.modules])\n"
    )
    _python(code)
    again = _python(code)
    assert again.stdout.count("(resumed)") == 4
    assert again.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.e2e
def test_torch_thread_counts_are_cached_per_environment(tmp_path):
    code = (
        "import sys\n"
        "from mlflow_ngraph.run.environment import torch_threads\n"
        f"threads = torch_threads({str(tmp_path)!r})\n"
        "import torch\n"
        "assert threads == (torch.get_num_threads(), torch.get_num_interop_threads())\n"
        "print(threads)\n"
    )
    probe = (
        "import sys\n"
        "from mlflow_ngraph.run.environment import torch_threads\n"
        f"print(torch_threads({str(tmp_path)!r}), 'torch' in sys.modules)\n"
    )
    first = _python(code)
    assert _python(probe).stdout.strip() == f"{first.stdout.strip()} False"
    other = _python(probe, OMP_NUM_THREADS="1")  # another environment: torch is asked
    assert other.stdout.strip().endswith("True") and other.stdout.startswith("(1,")
