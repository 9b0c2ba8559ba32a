import subprocess
import sys

HEAVY = ("openvino", "onnxruntime", "tvm", "tensorrt", "pynvml", "ray")


def test_importing_the_package_and_cli_imports_no_compiler_runtime():
    code = (
        "import sys, mlflow_ngraph, mlflow_ngraph.cli, mlflow_ngraph.compilers.registry, "
        "mlflow_ngraph.runner\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
