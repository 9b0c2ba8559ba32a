from __future__ import annotations

import pytest
import torch

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.models.registry import PAPER_MODELS, family_of, load_model

#: the paper's Table IV parameter counts (timm 1.0 names)
TABLE_IV = {
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "efficientnet_b3": 12_233_232,
    "efficientnet_b4": 19_341_616,
    "efficientnet_b5": 30_389_784,
    "deit3_small_patch16_224": 22_059_496,
    "deit3_medium_patch16_224": 38_849_512,
    "deit3_base_patch16_224": 86_585_320,
    "swin_s3_tiny_224": 28_328_674,
    "swin_s3_small_224": 49_737_298,
    "swin_s3_base_224": 71_125_762,
    "convnext_tiny": 28_589_128,
    "convnext_small": 50_223_688,
    "convnext_base": 88_591_464,
}
#: Table V: parameters per block at each width
TABLE_V = {
    "conv_block": {64: 37_056, 96: 83_232, 128: 147_840, 256: 590_592},
    "mha_block": {128: 66_048, 256: 263_168, 384: 591_360, 512: 1_050_624},
}


@pytest.mark.parametrize("kind", sorted(TABLE_V))
def test_block_parameters_per_block_match_table_v(kind):
    for width, per_block in TABLE_V[kind].items():
        one = load_model(kind, {"width": width, "depth": 1}).parameter_count
        two = load_model(kind, {"width": width, "depth": 2}).parameter_count
        assert two - one == per_block, (kind, width)


def test_blocks_shapes_and_layers():
    conv = load_model("conv_block", {"width": 16, "depth": 3})
    assert conv.sample_shape == (3, 224, 224)
    convs = [m for m in conv.module.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 4  # stem + 3 blocks
    assert all(c.kernel_size == (3, 3) and c.bias is not None for c in convs)
    mha = load_model("mha_block", {"width": 64, "depth": 2})
    assert mha.sample_shape == (10, 64)
    out = mha.module(torch.from_numpy(mha.random_input(3)))
    assert out.shape == (3, 10, 64) and bool((out >= 0).all())  # ends with ReLU


def test_models_are_deterministic():
    a = load_model("conv_block", {"width": 8, "depth": 1})
    b = load_model("conv_block", {"width": 8, "depth": 1})
    assert a.content_hash == b.content_hash
    assert a.content_hash != load_model("conv_block", {"width": 8, "depth": 2}).content_hash


def test_factory_model_with_params():
    model = load_model("tests.fixtures.models:tiny_mlp", {"hidden": 5, "input_shape": "4"})
    assert model.family == "custom" and model.sample_shape == (4,)
    assert model.parameter_count == 4 * 5 + 5 + 5 * 2 + 2


def test_onnx_file_model(tmp_path):
    torch_model = load_model("conv_block", {"width": 4, "depth": 1, "image_size": 16})
    path = tmp_path / "block.onnx"
    torch.onnx.export(
        torch_model.module,
        (torch.zeros(1, 3, 16, 16),),
        str(path),
        dynamo=False,
        input_names=["x"],
        dynamic_axes={"x": {0: "batch"}},
    )
    model = load_model(str(path))
    assert model.onnx_file == path.resolve() and model.module is None
    assert model.sample_shape == (3, 16, 16) and model.input_name == "x"
    # the exporter folds BatchNorm into the convolution, so the ONNX file holds fewer numbers
    assert 0 < model.parameter_count <= torch_model.parameter_count


def test_timm_init_params_pass_through():
    model = load_model("test_vit", {"img_size": 64})
    assert model.family == "custom" and model.sample_shape == (3, 64, 64)
    with pytest.raises(NgraphError, match="bad init params"):
        load_model("resnet18", {"no_such_kwarg": 1})


def test_families():
    for family, names in PAPER_MODELS.items():
        assert {family_of(n) for n in names} == {family}


@pytest.mark.e2e
@pytest.mark.slow
def test_the_paper_models_build_with_table_iv_parameter_counts():
    for name, count in TABLE_IV.items():
        model = load_model(name)
        assert model.parameter_count == count, name
        del model
