from pathlib import Path

import pytest

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.plan.config import build_spec, load_spec_file, parse_batch_sizes, split_name_args


def test_name_args_parse_scalars_and_keep_factory_colon():
    assert split_name_args("conv_block:width=64,depth=2", "model") == (
        "conv_block",
        {"width": 64, "depth": 2},
    )
    assert split_name_args("openvino:PERFORMANCE_HINT=LATENCY,fast=true", "compiler") == (
        "openvino",
        {"PERFORMANCE_HINT": "LATENCY", "fast": True},
    )
    assert split_name_args("pkg.mod:make", "model") == ("pkg.mod:make", {})
    assert split_name_args("pkg.mod:make:width=3", "model") == ("pkg.mod:make", {"width": 3})


def test_bad_name_args():
    with pytest.raises(NgraphError, match="not key=value"):
        split_name_args("conv_block:width", "model")


@pytest.mark.parametrize("text", ["0", "-2", "1,0", "x"])
def test_batch_sizes_must_be_positive_integers(text):
    with pytest.raises(NgraphError, match="batch size"):
        parse_batch_sizes(text)


def test_batch_sizes_sorted_unique():
    assert parse_batch_sizes("8,1,2,2") == [1, 2, 8]


def test_spec_file_round_trip(tmp_path: Path):
    path = tmp_path / "spec.yaml"
    path.write_text(
        "experiment: e\nmodels:\n  - resnet18\n  - {name: conv_block, params: {width: 8}}\n"
        "compilers: [identity, {name: onnxruntime, flags: {intra_op_num_threads: 2}}]\n"
        "batch_sizes: [1, 4]\nscenario: latency\nrepetitions: 7\nmin_duration: 0.5\n"
    )
    spec = build_spec(load_spec_file(path))
    assert [m.label for m in spec.models] == ["resnet18", "conv_block:width=8"]
    assert spec.compilers[1].flags == {"intra_op_num_threads": 2}
    assert spec.batch_sizes == [1, 4]
    assert spec.measure.scenario == "latency"
    assert spec.measure.repetitions == 7
    assert spec.measure.min_duration_s == 0.5
    assert len(spec.spec_hash) == 16


def test_spec_hash_ignores_tracking_uri_but_not_settings():
    base = {"models": ["resnet18"], "batch_sizes": [1]}
    a = build_spec({**base, "tracking_uri": "sqlite:///a.db"})
    b = build_spec({**base, "tracking_uri": "sqlite:///b.db"})
    c = build_spec({**base, "repetitions": 5})
    assert a.spec_hash == b.spec_hash != c.spec_hash


def test_device_profile_sets_default_compilers():
    spec = build_spec({"models": ["resnet18"], "device": "xeon"})
    assert [c.name for c in spec.compilers] == [
        "identity",
        "torchscript",
        "inductor",
        "onnxruntime",
        "openvino",
        "tvm",
    ]


def test_paper_model_set_expands_to_15():
    spec = build_spec({"models": ["paper"]})
    assert len(spec.models) == 15
    assert spec.models[0].name == "resnet18"


@pytest.mark.parametrize(
    "content, message",
    [
        ("models: [resnet18\n", "not valid YAML"),
        ("- a\n- b\n", "must be a mapping"),
        ("modles: [resnet18]\n", "unknown key 'modles'"),
    ],
)
def test_bad_spec_files(tmp_path: Path, content, message):
    path = tmp_path / "spec.yaml"
    path.write_text(content)
    with pytest.raises(NgraphError, match=message):
        load_spec_file(path)


@pytest.mark.parametrize(
    "data, message",
    [
        ({"models": []}, "no models"),
        ({"models": ["resnet18"], "scenario": "fast"}, "scenario"),
        ({"models": ["resnet18"], "repetitions": 0}, "repetitions"),
        ({"models": ["resnet18"], "device": "tpu"}, "unknown device profile 'tpu'"),
        ({"models": ["resnet18"], "warmup": "many"}, "warmup"),
    ],
)
def test_bad_settings(data, message):
    with pytest.raises(NgraphError, match=message):
        build_spec(data)


def test_parse_int_list_is_the_one_integer_list_parser():
    from mlflow_ngraph.plan.config import parse_int_list

    assert parse_int_list("1,2,4", "widths") == [1, 2, 4]
    assert parse_int_list("4 1 4", "widths") == [4, 1]  # order kept, repeats dropped
    assert parse_int_list([8, "2"], "batch size") == [8, 2]
    assert parse_int_list("1-3,8", "depths", ranges=True) == [1, 2, 3, 8]
    for text, fragment in (
        ("1-3", "is not an integer"),  # no ranges here
        ("0", "depths 0 must be a positive integer"),
        ("-4", "depths -4 must be a positive integer"),
        ("x", "'x' is not an integer"),
        ("", "no depths given"),
    ):
        with pytest.raises(NgraphError, match=fragment):
            parse_int_list(text, "depths")
    with pytest.raises(NgraphError, match="range '6-1' is empty"):
        parse_int_list("6-1", "depths", ranges=True)


def test_two_compiler_entries_with_the_same_resolved_flags_are_one_cell(tmp_path, caplog):
    # two entries would share one cell key, and a group measuring one cell twice never ends
    from mlflow_ngraph.run.runner import plan

    spec = build_spec(
        {
            "models": ["conv_block:width=8,depth=1,image_size=32"],
            "compilers": ["identity", "torchscript", "torchscript:freeze=true", "identity"],
        }
    )
    cells = plan(spec, tmp_path).cells
    assert [c.compiler.name for c in cells] == ["identity", "torchscript"]
    assert len({c.key for c in cells}) == 2
    assert "torchscript:freeze=True resolves to the same flags as torchscript" in caplog.text
