"""Issue 23: a shared store is not a trusted one. Each attack is planted as a store writer
would plant it (MLflow's client on a real store) on a copy of a store holding a real tiny
benchmark; each test asserts the refusal and that the payload did not run."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import mlflow
import numpy as np
import pytest
from deploy_support import cli
from trust_support import (
    EXPERIMENT,
    build_payload,
    cell_run,
    clone_store,
    download_engine,
    half_weights,
    native_engine_claiming_tvm,
    poison_index,
    rewrite_manifest,
)

from mlflow_ngraph import load_engine
from mlflow_ngraph.deploy import trust
from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.variables import environment

SAFE = {"MLFLOW_ALLOW_PICKLE_DESERIALIZATION": "false"}


def _tracking(uri: str):
    """MLflow's calls in this process go to ``uri``, with pickles refused, until the block
    ends; the environment is put back as it was."""
    return environment({"MLFLOW_TRACKING_URI": uri, **SAFE})


@pytest.fixture(scope="module")
def pristine(tiny_store):
    """A store holding a tiny benchmark with an ONNX Runtime and a TorchScript engine."""
    return tiny_store


@pytest.fixture
def store(pristine, tmp_path):
    """(tracking URI, client) of this test's own copy of the store."""
    from mlflow.tracking._tracking_service import utils

    # MLflow caches artifact repositories by run id, and every copy has the same run ids:
    # cleared for the copy, and after the test for whatever reads another copy next
    uri = clone_store(pristine, tmp_path / "store", skip_home=True)
    yield uri, mlflow.tracking.MlflowClient(uri)
    utils._artifact_repos_cache.clear()


def pull(uri, out, *extra):
    args = ["pull", "-e", EXPERIMENT, "--device", "cpu", "--model", "conv_block"]
    return cli(*args, *extra, "-o", str(out), "--tracking-uri", uri)


def register(uri, *extra, env=None):
    args = ["register", "-e", EXPERIMENT, "--device", "cpu", "--model", "conv_block"]
    return cli(*args, *extra, "--tracking-uri", uri, env={**SAFE, **(env or {})})


def one_error(result) -> str:
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    return errors[0]


def _x(batch=1):
    return np.random.default_rng(0).standard_normal((batch, 3, 32, 32)).astype(np.float32)


# --- attack 1: native code in a folder whose manifest claims another compiler -------------
def test_native_code_claiming_tvm_does_not_run(store, tmp_path):
    uri, client = store
    marker = tmp_path / "marker"
    payload = build_payload(tmp_path / "build", marker)
    run = cell_run(client, "onnxruntime")
    folder = download_engine(client, run.info.run_id, 1, tmp_path / "attacker")
    native_engine_claiming_tvm(folder, payload)
    client.log_artifacts(run.info.run_id, str(folder), artifact_path="engines/bs1")

    out = tmp_path / "pulled"
    line = one_error(pull(uri, out, "--compiler", "onnxruntime", "--batch-size", "1"))
    assert "the one its run recorded" in line and "refusing" in line
    assert not out.exists()
    line = one_error(register(uri, "--compiler", "onnxruntime", "--batch-size", "1"))
    assert "the one its run recorded" in line
    # pinned by hand to the attacker's manifest: the run's params still decide
    evil = trust.file_sha256(folder / "manifest.json")
    line = one_error(pull(uri, out, "--compiler", "onnxruntime", "--batch-size", "1",
                          "--sha256", evil))  # fmt: skip
    assert "refusing" in line
    # the folder itself, handed over some other way: refused before any loader runs
    line = one_error(cli("run-engine", str(folder)))
    assert "lacks compiler_version, host_cpu, cpu_flags" in line
    with pytest.raises(NgraphError, match="lacks compiler_version"):
        load_engine(folder, trust_code=True)
    assert not marker.exists()


def test_the_run_decides_the_loader():
    params = {"compiler": "onnxruntime", "flag.provider": "cpu"}
    manifest = {"compiler": "tvm", "flags": {"provider": "cpu"}}
    with pytest.raises(NgraphError, match="its run recorded 'onnxruntime'"):
        trust.check_against_run(manifest, params, "cell")
    manifest = {"compiler": "onnxruntime", "flags": {"provider": "cuda"}}
    with pytest.raises(NgraphError, match="flag provider='cuda'"):
        trust.check_against_run(manifest, params, "cell")
    trust.check_against_run({"compiler": "onnxruntime", "flags": {"provider": "cpu"}}, params, "c")


# --- attack 2: changed weights, manifest rewritten to match ------------------------------
def test_changed_weights_with_a_rewritten_manifest_are_refused(store, tmp_path):
    uri, client = store
    run = cell_run(client, "onnxruntime")
    folder = download_engine(client, run.info.run_id, 1, tmp_path / "attacker")
    half_weights(folder / "model.ort.onnx")
    rewrite_manifest(folder)
    client.log_artifacts(run.info.run_id, str(folder), artifact_path="engines/bs1")
    out = tmp_path / "pulled"
    line = one_error(pull(uri, out, "--compiler", "onnxruntime", "--batch-size", "1"))
    assert "changed after it was logged" in line
    assert not out.exists()


# --- attack 3: code in the registered model ----------------------------------------------
def _register_onnx(uri, name="tiny-ort"):
    done = register(uri, "--compiler", "onnxruntime", "--batch-size", "1", "--name", name)
    assert done.returncode == 0, done.stderr[-3000:]
    return name


def _logged_model(client, name):
    version = client.get_model_version_by_alias(name, "cpu")
    return version, client.get_logged_model(version.source.removeprefix("models:/"))


def test_the_registered_model_holds_data_only_and_its_code_is_the_installed_one(store, tmp_path):
    uri, client = store
    name = _register_onnx(uri)
    version, logged = _logged_model(client, name)
    local = Path(
        mlflow.artifacts.download_artifacts(logged.artifact_location, dst_path=str(tmp_path))
    )
    assert not list(local.rglob("*.py")) and not list(local.rglob("*.pkl"))
    conf = __import__("yaml").safe_load((local / "MLmodel").read_text())
    pf = conf["flavors"]["python_function"]
    assert pf["loader_module"] == "mlflow_ngraph.deploy.pyfunc_model" and not pf.get("code")
    assert pf["config"]["manifest_sha256"] == version.tags["manifest_sha256"]
    with _tracking(uri):
        from mlflow_ngraph import load_registered

        checked = load_registered(f"models:/{name}@cpu")
        plain = mlflow.pyfunc.load_model(f"models:/{name}@cpu")
        np.testing.assert_array_equal(checked.predict(_x()), plain.predict(_x()))


def _tamper_logged_model(client, logged, tmp_path, how):
    """Rewrite the logged model's files as an experiment writer can."""
    local = Path(
        mlflow.artifacts.download_artifacts(logged.artifact_location, dst_path=str(tmp_path / "lm"))
    )
    marker = tmp_path / "marker"
    conf_path = local / "MLmodel"
    text = conf_path.read_text()
    if how == "code":
        code = local / "code"
        code.mkdir()
        (code / "evil_loader.py").write_text(
            f"open({str(marker)!r}, 'w').write('ran')\n"
            "from mlflow_ngraph.deploy.pyfunc_model import _load_pyfunc  # noqa\n"
        )
        text = text.replace("loader_module: mlflow_ngraph.deploy.pyfunc_model",
                            "loader_module: evil_loader\n    code: code")  # fmt: skip
    elif how == "predict_fn":  # the pyfunc wrapper calls another method of the loaded model
        text = text.replace("    loader_module:", "    predict_fn: __init__\n    loader_module:")
    elif how == "value":  # a key register writes, another value
        assert "    streamable: false" in text
        text = text.replace("    streamable: false", "    streamable: true")
    else:  # weights, the engine's manifest and the MLmodel's recorded hash rewritten
        (engine,) = [p.parent for p in local.rglob("manifest.json")]
        half_weights(engine / "model.ort.onnx")
        old = trust.file_sha256(engine / "manifest.json")
        rewrite_manifest(engine)
        text = text.replace(old, trust.file_sha256(engine / "manifest.json"))
    conf_path.write_text(text)
    client.log_model_artifacts(logged.model_id, str(local))
    return marker


def test_serve_serves_the_checked_registered_engine(store, tmp_path):
    import subprocess
    import urllib.request

    from deploy_support import PYTHON

    from tests._support import free_port, wait_http

    uri, _ = store
    name = _register_onnx(uri)
    port = free_port()
    env = {**os.environ, **SAFE, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    serve = subprocess.Popen(
        [PYTHON, "-m", "mlflow_ngraph", "serve", f"models:/{name}@cpu", "-p", str(port),
         "--tracking-uri", uri],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{port}/ping", serve, 180)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/invocations",
            data=json.dumps({"inputs": _x().tolist()}).encode(),
            headers={"Content-Type": "application/json"},
        )
        answer = json.loads(urllib.request.urlopen(request, timeout=60).read())
        with _tracking(uri):
            from mlflow_ngraph import load_registered

            expected = load_registered(f"models:/{name}@cpu").predict(_x())
        served = np.asarray(answer["predictions"], dtype=np.float32)
        np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6)
    finally:
        serve.terminate()
        serve.wait(60)
    with pytest.raises(OSError):  # the server went with the command
        urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2)


#: what the refusal of each change of a registered model says
REFUSED = {
    "code": "asks MLflow to run",
    "weights": "engine hash is not the registered",
    "predict_fn": "asks MLflow to run {'predict_fn': '__init__'}",
    "value": "flavors.python_function.streamable is True, not False",
}


@pytest.mark.parametrize("how", list(REFUSED))
def test_a_changed_registered_model_is_refused(store, tmp_path, how):
    uri, client = store
    name = _register_onnx(uri)
    _, logged = _logged_model(client, name)
    marker = _tamper_logged_model(client, logged, tmp_path, how)
    with _tracking(uri):
        from mlflow_ngraph import load_registered

        why = re.escape(REFUSED[how])
        with pytest.raises(NgraphError, match=why):
            load_registered(f"models:/{name}@cpu")
    served = cli("serve", f"models:/{name}@cpu", "-p", "1", "--tracking-uri", uri, env=SAFE)
    assert "refusing it" in one_error(served)
    assert "checked" not in served.stdout and not marker.exists()


def test_the_registered_version_pins_the_engine(store, tmp_path):
    """The loader compares the engine against the hash its MLmodel records (a changed engine
    under an intact MLmodel is refused, with MLflow's own load_model too)."""
    uri, client = store
    name = _register_onnx(uri)
    _, logged = _logged_model(client, name)
    local = Path(
        mlflow.artifacts.download_artifacts(logged.artifact_location, dst_path=str(tmp_path))
    )
    (engine,) = [p.parent for p in local.rglob("manifest.json")]
    half_weights(engine / "model.ort.onnx")
    rewrite_manifest(engine)
    client.log_model_artifacts(logged.model_id, str(local))
    with _tracking(uri):
        with pytest.raises(NgraphError, match="changed after it was logged"):
            mlflow.pyfunc.load_model(f"models:/{name}@cpu")


# --- attack 4: a poisoned results index ---------------------------------------------------
def test_a_poisoned_index_never_crowns_a_run_without_metrics(store, tmp_path):
    uri, client = store
    genuine = cell_run(client, "onnxruntime")
    empty = client.create_run(genuine.info.experiment_id, tags={"mlflow.user": "mallory"})
    poison_index(client, genuine, empty.info.run_id)
    out = tmp_path / "pulled"
    done = pull(uri, out, "--compiler", "onnxruntime", "--batch-size", "1")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    # the empty run holds no signed record: set aside before any is chosen
    assert "not signed by a producer you trust: it is not signed" in done.stdout
    (chose,) = [line for line in done.stdout.splitlines() if line.startswith("chose")]
    assert genuine.info.run_id in chose and "logged by" in chose
    assert json.loads((out / "source.json").read_text())["run_id"] == genuine.info.run_id
    # a record whose metrics differ from its own run's is refused the same way
    poison_index(client, genuine, genuine.info.run_id, factor=3.0)
    done = pull(uri, tmp_path / "again", "--compiler", "onnxruntime", "--batch-size", "1")
    # the genuine run is signed: ranked on its signed figures, the store's said altered
    assert "tampering: the store's figures of" in done.stdout


# --- attack 5: manifest paths not confined, unlisted files --------------------------------
def test_manifest_paths_are_confined_and_unlisted_files_ignored(store, tmp_path):
    uri, client = store
    marker = tmp_path / "marker"
    payload = build_payload(tmp_path / "build", marker)
    run = cell_run(client, "onnxruntime")
    # an unlisted file planted beside a genuine engine: neither copied nor loaded
    extra = tmp_path / "extra"
    extra.mkdir()
    shutil.copyfile(payload, extra / "libcustom_ops.so")
    (extra / "evil.onnx").write_bytes(b"not listed")
    client.log_artifacts(run.info.run_id, str(extra), artifact_path="engines/bs1")
    out = tmp_path / "pulled"
    done = pull(uri, out, "--compiler", "onnxruntime", "--batch-size", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    listed = ["manifest.json", "model.ort.onnx", "provenance.json", "provenance.sig", "source.json"]
    assert sorted(p.name for p in out.iterdir()) == listed
    with load_engine(out) as engine:
        engine.predict(_x())
    # a manifest naming a file outside its folder
    folder = download_engine(client, run.info.run_id, 1, tmp_path / "attacker")
    hostname = Path("/etc/hostname")
    outside = "../../../../../../../../etc/hostname"
    manifest = json.loads((folder / "manifest.json").read_text())
    entry = {"path": outside, "bytes": 0, "sha256": "0" * 64}
    if hostname.is_file():
        entry.update(bytes=hostname.stat().st_size, sha256=trust.file_sha256(hostname))
    manifest["files"] = [entry]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    client.log_artifacts(run.info.run_id, str(folder), artifact_path="engines/bs1")
    line = one_error(pull(uri, tmp_path / "p2", "--compiler", "onnxruntime", "--batch-size", "1"))
    assert "refusing" in line
    with pytest.raises(NgraphError, match="outside the engine folder"):
        load_engine(folder)
    manifest["files"] = [{"path": "/etc/hostname", "bytes": 1, "sha256": "0" * 64}]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(NgraphError, match="outside the engine folder"):
        load_engine(folder)
    # the loader's file must be listed: an unlisted, altered model.ort.onnx is not loaded
    manifest["files"] = [{"path": "source.json", "bytes": 1, "sha256": "0" * 64}]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(NgraphError, match="does not list model.ort.onnx"):
        load_engine(folder)
    assert not marker.exists()


# --- pinning and trusting code ------------------------------------------------------------
def test_sha256_pinning(store, tmp_path):
    uri, client = store
    out = tmp_path / "pulled"
    done = pull(uri, out, "--compiler", "onnxruntime", "--batch-size", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    digest = trust.file_sha256(out / "manifest.json")
    assert f"manifest sha256 {digest}" in done.stdout
    run = cell_run(client, "onnxruntime")
    assert run.data.params[trust.engine_param(1)] == digest
    again = pull(uri, tmp_path / "pinned", "--compiler", "onnxruntime", "--batch-size", "1",
                 "--sha256", digest)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    line = one_error(pull(uri, tmp_path / "other", "--compiler", "onnxruntime",
                          "--batch-size", "1", "--sha256", "ab" * 32))  # fmt: skip
    assert "pinned with --sha256" in line and not (tmp_path / "other").exists()
    load_engine(out, sha256=digest).close()
    with pytest.raises(NgraphError, match="the sha256 pinned"):
        load_engine(out, sha256="ab" * 32)
    ran = cli("run-engine", str(out), "--sha256", digest[:16], "--repetitions", "1")
    assert ran.returncode == 0, ran.stderr[-2000:]


def test_executable_formats_need_trust_code(store, tmp_path, monkeypatch):
    uri, _ = store
    out = tmp_path / "ts"
    done = pull(uri, out, "--compiler", "torchscript", "--batch-size", "1")
    assert done.returncode == 0, done.stderr[-3000:]  # pull itself loads nothing
    assert "need --trust-code" in done.stdout
    line = one_error(cli("run-engine", str(out), "--repetitions", "1"))
    assert "TorchScript program" in line and "--trust-code" in line
    with pytest.raises(NgraphError, match="trust-code"):
        load_engine(out)
    ran = cli("run-engine", str(out), "--repetitions", "1", "--trust-code")
    assert ran.returncode == 0, ran.stderr[-2000:]
    load_engine(out, trust_code=True).close()
    monkeypatch.setenv(trust.TRUST_ENV, "1")
    load_engine(out).close()
    monkeypatch.delenv(trust.TRUST_ENV)
    line = one_error(register(uri, "--compiler", "torchscript", "--batch-size", "1"))
    assert "--trust-code" in line
    done = register(uri, "--compiler", "torchscript", "--batch-size", "1", "--trust-code")
    assert done.returncode == 0, done.stderr[-3000:]
    # ONNX and OpenVINO IR are data: no trust asked
    onnx_out = tmp_path / "ort"
    assert pull(uri, onnx_out, "--compiler", "onnxruntime").returncode == 0
    load_engine(onnx_out).close()


def test_no_custom_op_library_comes_in_through_onnx(store, tmp_path):
    """An ONNX engine whose graph uses an operator of an unknown domain, with a library
    beside it: ONNX Runtime refuses the graph, nothing loads the library."""
    import onnx
    from onnx import TensorProto, helper

    uri, _ = store
    marker = tmp_path / "marker"
    payload = build_payload(tmp_path / "build", marker)
    out = tmp_path / "ort"
    assert pull(uri, out, "--compiler", "onnxruntime", "--batch-size", "1").returncode == 0
    node = helper.make_node("Payload", ["input"], ["output"], domain="com.attacker")
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3, 32, 32])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("com.attacker", 1)])
    onnx.save(model, str(out / "model.ort.onnx"))
    shutil.copyfile(payload, out / "libcom_attacker.so")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["files"].append({"path": "libcom_attacker.so", "bytes": 0, "sha256": ""})
    (out / "manifest.json").write_text(json.dumps(manifest))
    rewrite_manifest(out)
    with pytest.raises(NgraphError, match="its manifest is not the one .* signed"):
        load_engine(out)
    # and were the folder's manifest signed, the loader itself takes no library in
    with pytest.raises(NgraphError, match="onnxruntime could not load the engine"):
        load_engine(out, allow_unsigned=True)
    assert not marker.exists()
