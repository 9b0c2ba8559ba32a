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
