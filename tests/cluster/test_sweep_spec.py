"""The sweep spec is validated before anything starts on Ray."""

from __future__ import annotations

import pytest

from mlflow_ngraph.cluster.spec import parse_sweep
from mlflow_ngraph.errors import NgraphError

BASE = {
    "experiment": "edge",
    "models": [{"name": "conv_block", "params": {"width": 8, "depth": 1}}],
    "compilers": ["identity", "onnxruntime"],
    "batch_sizes": [1, 2, 4, 8],
}


def test_devices_get_the_shared_settings_and_their_own_overrides():
    sweep = parse_sweep(
        {**BASE, "devices": [{"name": "xeon-a", "profile": "xeon"},
                             {"name": "b", "profile": "cpu", "batch_sizes": [1, 2]}]}
    )  # fmt: skip
    a, b = sweep.devices
    assert (a.spec["device"], a.spec["batch_sizes"]) == ("xeon", [1, 2, 4, 8])
    assert (b.spec["device"], b.spec["batch_sizes"]) == ("cpu", [1, 2])
    assert a.resource == "ngraph_device_xeon-a" and sweep.experiment == "edge"


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        ([{"name": "a", "profile": "tpu"}], "unknown profile 'tpu'"),
        ([{"name": "a", "profile": "cpu"}, {"name": "a", "profile": "xeon"}], "given twice"),
        ([{"name": "a b", "profile": "cpu"}], "letters, digits"),
        ([{"name": "a"}], "'name' and 'profile'"),
        ([{"name": "a", "profile": "cpu", "warmup": 3}], "unknown key 'warmup'"),
        ([{"name": "a", "profile": "cpu", "batch_sizes": [0]}], "device 'a': batch size 0"),
        ([], "'devices' must list"),
    ],
)
def test_bad_device_lists_are_one_line(devices, message):
    with pytest.raises(NgraphError, match=message):
        parse_sweep({**BASE, "devices": devices})


def test_unknown_top_level_key():
    with pytest.raises(NgraphError, match="unknown key 'device'"):
        parse_sweep({**BASE, "device": "cpu", "devices": [{"name": "a", "profile": "cpu"}]})


def test_the_same_sweep_into_the_same_store_keeps_its_id():
    """A sweep run again after a crash resumes under its id (``compare --sweep`` then shows
    the cells measured before the crash too); another spec or store is another sweep."""
    from mlflow_ngraph.cluster.sweep import sweep_key

    devices = [{"name": "xeon-a", "profile": "xeon"}]
    one = parse_sweep({**BASE, "devices": devices})
    uri = "http://user:secret@127.0.0.1:5000"
    assert sweep_key(one, uri) == sweep_key(parse_sweep({**BASE, "devices": devices}), uri)
    assert sweep_key(one, uri) != sweep_key(one, "http://127.0.0.1:5001")
    other = parse_sweep({**BASE, "devices": devices, "batch_sizes": [1]})
    assert sweep_key(one, uri) != sweep_key(other, uri)


LOADGEN = {"scenarios": ["offline", "Server"], "latency_bound_ms": 40, "min_duration_s": 5,
           "max_batch": 4}  # fmt: skip


def test_a_loadgen_section_reaches_every_device_and_its_command():
    """Each device runs the section's scenarios after its benchmark, on its own models x
    compilers and profile, into the sweep's experiment; the store and the device's name stay
    in the task's environment, off the command line."""
    from mlflow_ngraph.cluster.sweep import loadgen_command

    openvino = {"name": "openvino", "flags": {"num_streams": 2}}
    devices = [{"name": "a", "profile": "cpu"},
               {"name": "b", "profile": "xeon", "compilers": [openvino]}]  # fmt: skip
    sweep = parse_sweep({**BASE, "loadgen": LOADGEN, "devices": devices})
    a, b = sweep.devices
    want = {"scenarios": ["offline", "server"], "latency_bound_ms": 40.0,
            "min_duration_s": 5.0, "max_batch": 4}  # fmt: skip
    assert sweep.loadgen == a.loadgen == b.loadgen == want
    assert "loadgen" not in a.spec  # the benchmark's own spec is unchanged
    command = loadgen_command(a.spec, a.loadgen, sweep.experiment)
    assert command[1:4] == ["-m", "mlflow_ngraph", "loadgen"]
    args = " ".join(command[4:])
    assert args == (
        "--device cpu --experiment edge --model conv_block:depth=1,width=8 --compiler identity "
        "--compiler onnxruntime --scenario offline --scenario server --latency-bound 40 "
        "--min-duration 5 --max-batch 4"
    )
    b_args = loadgen_command(b.spec, b.loadgen, sweep.experiment)
    assert "--device xeon" in " ".join(b_args)
    assert "--compiler openvino:num_streams=2" in " ".join(b_args)
    assert "http" not in args and "sqlite" not in args


def test_the_loadgen_command_parses_back_to_the_same_cells():
    """What the device's command says is what the section and the spec said: the loadgen
    command's own parser reads it back to the same settings, models and compilers."""

    from mlflow_ngraph.cluster.sweep import loadgen_command
    from mlflow_ngraph.commands.loadgen import loadgen

    sweep = parse_sweep({**BASE, "loadgen": LOADGEN, "devices": [{"name": "a", "profile": "cpu"}]})
    command = loadgen_command(sweep.devices[0].spec, sweep.loadgen, sweep.experiment)
    ctx = loadgen.make_context("loadgen", command[4:])
    o = ctx.params
    assert o["scenarios"] == ("offline", "server") and o["latency_bound"] == 40.0
    assert (o["min_duration"], o["max_batch"], o["experiment"]) == (5.0, 4, "edge")
    assert o["models"] == ("conv_block:depth=1,width=8",)
    assert o["compilers"] == ("identity", "onnxruntime")


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"scenarios": ["offline", "burst"]}, "loadgen.scenarios: unknown scenario 'burst'"),
        ({"scenarios": []}, "loadgen.scenarios: unknown scenario '\\(none\\)'"),
        ({"scenarios": ["server"], "latency_bound_ms": 0}, "latency_bound_ms must be above 0"),
        ({"scenarios": ["server"], "latency_bound_ms": -5}, "latency_bound_ms must be above 0"),
        ({"scenarios": ["server"], "latency_bound_ms": "x"}, "latency_bound_ms must be a number"),
        ({"scenarios": ["offline"], "max_batch": 1.5}, "loadgen.max_batch must be an integer"),
        ({"scenarios": ["offline"], "min_duration_s": 0}, "loadgen.min_duration_s must be above 0"),
        ({"scenarios": ["offline"], "url": "http://x"}, "unknown key 'loadgen.url'"),
        (["offline"], "'loadgen' must be a mapping"),
    ],
)  # fmt: skip
def test_bad_loadgen_sections_are_one_line_naming_the_field(section, message):
    with pytest.raises(NgraphError, match=message) as caught:
        parse_sweep({**BASE, "loadgen": section, "devices": [{"name": "a", "profile": "cpu"}]})
    assert "\n" not in str(caught.value)


def test_scenarios_make_another_sweep_and_none_keep_the_old_id():
    from mlflow_ngraph.cluster.sweep import sweep_key

    devices = [{"name": "a", "profile": "cpu"}]
    plain = parse_sweep({**BASE, "devices": devices})
    with_lg = parse_sweep({**BASE, "loadgen": LOADGEN, "devices": devices})
    uri = "sqlite:////tmp/x.db"
    assert plain.loadgen is None and plain.devices[0].loadgen is None
    assert sweep_key(plain, uri) != sweep_key(with_lg, uri)
