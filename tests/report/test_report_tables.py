"""Every compare value against hand-computed numbers, from runs logged in a real store.

The data set is in conftest.py. Values are compared with ``approx(rel=1e-12)``: exact up to
floating-point rounding.
"""

from __future__ import annotations

import math

import pytest
from report_data import DEIT, EFF, R18, R50, one, records_of

from mlflow_ngraph.report.tables import kendall_tau, swapped_pairs


def exact(value: float):
    return pytest.approx(value, rel=1e-12, abs=1e-15)


@pytest.fixture(scope="module")
def cells(store):
    """The per-cell JSON over both experiments (one compare for the whole module)."""
    from click.testing import CliRunner

    from mlflow_ngraph.commands.report import compare

    uri, _ = store
    result = CliRunner().invoke(compare, ["--tracking-uri", uri, "--format", "json"])
    return records_of(result)


@pytest.fixture(scope="module")
def all_tables(store):
    from click.testing import CliRunner

    from mlflow_ngraph.commands.report import compare

    uri, _ = store
    result = CliRunner().invoke(
        compare, ["--tracking-uri", uri, "--format", "json", "--table", "all"]
    )
    return records_of(result)


def test_relative_metrics_are_recomputed_from_throughputs(cells):
    row = one(cells, device="cpu", model=R18, compiler="openvino", batch_size=4)
    assert row["throughput"] == 640
    assert row["throughput_std"] == exact(6.4)
    assert row["latency_p50_ms"] == exact(6.25)
    assert row["cpu_percent"] == 90
    assert row["speedup"] == exact(640 / 240)
    assert row["rtr"] == exact(640 / 200)
    assert row["ase"] == exact(640 / (4 * 200))  # 0.8
    assert row["bsr"] == exact(0.8 / (240 / (4 * 100)))  # identity ASE(4) = 0.6
    assert row["cpu_reduction_pct"] == exact(100 * (1 - 90 / 50))  # -80: more CPU
    assert row["max_abs_error"] == exact(1e-6)
    assert row["status"] == "OK" and row["missing"] == ""
    assert 999.0 not in {r["speedup"] for r in cells} | {r["bsr"] for r in cells}


def test_every_batch_of_a_compiled_model(cells):
    deit = {r["batch_size"]: r for r in cells if r["model"] == DEIT and r["compiler"] == "openvino"}
    assert sorted(deit) == [1, 2, 4, 8]
    assert deit[1]["speedup"] == exact(3.0) and deit[1]["bsr"] == exact(1.0)
    assert deit[2]["rtr"] == exact(1.8) and deit[2]["ase"] == exact(0.9)
    assert deit[2]["bsr"] == exact(0.9 / 0.9)  # identity ASE(2) = 90 / (2 * 50)
    assert deit[8]["speedup"] == exact(5.0)
    assert deit[8]["rtr"] == exact(1000 / 150)
    assert deit[8]["ase"] == exact(1000 / 150 / 8)
    assert deit[8]["bsr"] == exact((1000 / 150 / 8) / (200 / 50 / 8))


def test_identity_is_its_own_baseline(cells):
    row = one(cells, device="cpu", model=EFF, compiler="identity", batch_size=8)
    assert (row["speedup"], row["bsr"], row["cpu_reduction_pct"]) == (1.0, 1.0, 0.0)
    assert row["rtr"] == exact(250 / 60) and row["ase"] == exact(250 / 480)


def test_newest_run_of_a_cell_wins(cells):
    rows = [r for r in cells if r["model"] == R18 and r["compiler"] == "openvino"]
    assert sorted(r["batch_size"] for r in rows) == [1, 2, 4, 8]
    assert one(rows, batch_size=1)["throughput"] == 200  # the older run logged 1.0


def test_invalid_and_failed_cells_are_shown_with_their_status(cells):
    invalid = one(cells, model=R18, compiler="tvm", batch_size=8)
    assert invalid["status"] == "INVALID" and invalid["throughput"] == exact(9000)
    # wrong outputs: no relative metric, on either side of a ratio (schema.is_usable)
    assert invalid["speedup"] is None and invalid["rtr"] is None
    assert invalid["missing"] == "no relative metrics: not an OK measurement (INVALID)"
    failed = one(cells, model=DEIT, compiler="tvm")
    assert failed["status"] == "FAILED" and failed["batch_size"] is None
    assert failed["throughput"] is None and failed["speedup"] is None
    assert failed["missing"] == "no throughput measured (FAILED: compile failed: unsupported op)"


def test_missing_baseline_is_missing_with_the_reason(cells):
    row = one(cells, device="gpu", model=R18, compiler="tensorrt", batch_size=8)
    assert row["speedup"] is None and row["bsr"] is None
    assert row["rtr"] == exact(6.0) and row["ase"] == exact(0.75)
    assert row["missing"] == "speedup, bsr: no identity run for resnet18 on gpu"
    no_batch1 = one(cells, device="gpu", model=EFF, compiler="tensorrt", batch_size=8)
    assert no_batch1["rtr"] is None and no_batch1["ase"] is None
    assert no_batch1["missing"] == (
        "speedup, bsr: no identity run for efficientnet_b3 on gpu; "
        "rtr, ase, bsr: no OK batch-1 throughput"
    )
    block = one(cells, model="conv_block:depth=2,width=96", compiler="openvino", batch_size=16)
    assert block["speedup"] is None and block["bsr"] is None
    assert block["rtr"] == exact(120 / 20)
    assert block["missing"] == "speedup, bsr: identity not measured OK at batch 16"


def test_family_table_is_table_vi(all_tables):
    families = all_tables["families"]
    ident = one(families, family="resnet", compiler="identity", device="cpu")
    assert ident["throughput_bs2-4"] == exact((160 + 240 + 80 + 120) / 4)
    # pooled std: root mean square of the per-cell stds (1 % of each throughput here)
    assert ident["throughput_bs2-4_std"] == exact(
        math.sqrt((1.6**2 + 2.4**2 + 0.8**2 + 1.2**2) / 4)
    )
    assert ident["cpu_percent_bs2-4"] == 50 and ident["cells_bs2-4"] == 4
    assert ident["throughput_bs8-16"] == exact((320 + 160) / 2) and ident["cells_bs8-16"] == 2
    assert ident["cpu_percent_bs2-4_std"] is None  # the runner logs no CPU std (yet)
    ov = one(families, family="resnet", compiler="openvino", device="cpu")
    assert ov["throughput_bs2-4"] == exact(375.0)
    assert ov["throughput_bs2-4_std"] == exact(math.sqrt((3.6**2 + 6.4**2 + 1.8**2 + 3.2**2) / 4))
    assert ov["cpu_percent_bs2-4"] == exact(85.0) and ov["cpu_percent_bs8-16"] == 100
    assert ov["throughput_bs8-16"] == exact(680.0)
    trt = one(families, family="resnet", compiler="tensorrt", device="gpu")
    assert trt["throughput_bs2-4"] is None and trt["cells_bs2-4"] == 0
    assert trt["throughput_bs8-16"] == 6000
    blocks = one(families, family="conv_block", compiler="openvino", device="cpu")
    assert blocks["cells_bs8-16"] == 3 + 3 + 2 + 2  # w64: 3 depths x (8, 16); w96: 2 x (8, 16)
    assert all(f["compiler"] != "tvm" for f in families)  # invalid and failed: no results


def test_families_over_custom_ranges(compare_cli):
    args = ["--table", "families", "--ranges", "1,4-8", "--family", "deit"]
    result = compare_cli("-e", "paper", "--format", "json", "--compiler", "openvino", *args)
    (row,) = records_of(result)
    assert row["throughput_bs1"] == 150 and row["cells_bs1"] == 1
    assert row["throughput_bs4-8"] == exact((480 + 1000) / 2)


def test_depth_table_is_tables_vii_viii(all_tables):
    depth = all_tables["depth"]
    w64 = one(depth, model="conv_block", device="cpu", compiler="openvino", width=64)
    # speedups 2, 3, 4 at depths 1, 2, 4: slope = sum(dd * ds) / sum(dd^2) with mean depth 7/3
    assert w64["slope_bs8"] == exact(3 / (42 / 9))  # 9/14
    assert w64["retention_bs8"] == exact(4.0 / 2.0)
    assert w64["slope_bs16"] == exact(0.0) and w64["retention_bs16"] == exact(1.0)
    assert w64["depths"] == "1,2,4" and w64["note"] == ""
    w96 = one(depth, model="conv_block", device="cpu", compiler="openvino", width=96)
    assert w96["slope_bs8"] == exact((4.0 - 2.0) / (4 - 2))
    assert w96["retention_bs8"] is None and w96["slope_bs16"] is None
    assert w96["note"] == "bs8: no depth-1 run, no retention; bs16: 0 depth(s) measured"


def test_compile_table_is_table_iii(all_tables):
    compile_ = all_tables["compile"]
    r18 = one(compile_, model=R18, batch_size=8)
    assert r18["cpu openvino [s]"] == 3.5 and r18["gpu tensorrt [s]"] == 16
    assert one(compile_, model=R18, batch_size=1)["gpu tensorrt [s]"] == 11
    assert one(compile_, model=EFF, batch_size=8)["gpu tensorrt [s]"] is None  # a cache hit
    assert {r["model"] for r in compile_} == {R18, R50, EFF, DEIT}
    assert set(compile_[0]) == {"model", "batch_size", "cpu openvino [s]", "gpu tensorrt [s]"}


def test_payback_table_is_compile_time_over_time_saved_per_inference(all_tables, cells):
    payback = all_tables["payback"]
    r18 = one(cells, device="cpu", model=R18, compiler="openvino", batch_size=8)
    s = r18["speedup"]
    identity = one(cells, device="cpu", model=R18, compiler="identity", batch_size=8)["throughput"]
    # 3.5 s / (1/T_id - 1/T_ov) samples, in inferences of 8 samples (the metric's name)
    expected = 3.5 * identity * s / (s - 1) / 8
    assert one(payback, model=R18, batch_size=8)["cpu openvino [inferences]"] == exact(expected)
    assert one(payback, model=EFF, batch_size=8).get("gpu tensorrt [inferences]") is None
    slower = [r for r in cells if r["compiler"] != "identity" and r["speedup"]
              and r["speedup"] <= 1 and r["status"] == "OK"]  # fmt: skip
    for row in slower:  # never paid back: said, not a negative number
        key = f"{row['device']} {row['compiler']} [inferences]"
        found = [p for p in payback if p["model"] == row["model"]
                 and p["batch_size"] == row["batch_size"] and key in p]  # fmt: skip
        assert all(p[key] in ("never", None) for p in found)


def test_pareto_table_holds_exactly_the_undominated_measurements(all_tables, cells):
    front = all_tables["pareto"]
    ok = [r for r in cells if r["status"] == "OK" and r["throughput"]]
    for device, model in {(r["device"], r["model"]) for r in ok}:
        mine = [r for r in ok if (r["device"], r["model"]) == (device, model)]

        def p99(r):
            return 1500 * r["batch_size"] / r["throughput"]

        expected = {
            (r["compiler"], r["batch_size"])
            for r in mine
            if not any(
                o["throughput"] >= r["throughput"]
                and p99(o) <= p99(r)
                and (o["throughput"], p99(o)) != (r["throughput"], p99(r))
                for o in mine
            )  # fmt: skip
        }
        got = {(r["compiler"], r["batch_size"]) for r in front
               if (r["device"], r["model"]) == (device, model)}  # fmt: skip
        assert got == expected, (device, model)


def test_ranking_flips_with_kendall_tau(all_tables):
    flips = all_tables["flips"]
    at8 = one(flips, device="cpu", batch_size=8, compiler="openvino", among="models", level="model")
    assert at8["n"] == 4 and at8["kendall_tau"] == exact((4 - 2) / 6)
    assert at8["swapped"] == 2
    # every throughput of the data set is +-1% (std), so both swaps are beyond noise
    # (judged on this run's intervals: the data set has no re-run intervals, and says so)
    assert at8["swapped_pairs"] == (
        "efficientnet_b3 > deit3_small_patch16_224 (beyond this run's noise); "
        "resnet18 > deit3_small_patch16_224 (beyond this run's noise)"
    )
    assert at8["beyond_noise"] == 2
    # noise of 1% moves no pair: the interval collapses onto tau
    assert at8["tau_ci_low"] == exact(at8["kendall_tau"]) == exact(at8["tau_ci_high"])
    assert at8["identity_order"] == f"{R18} > {EFF} > {DEIT} > {R50}"
    assert at8["compiler_order"] == f"{DEIT} > {R18} > {EFF} > {R50}"
    # families: resnet = mean(resnet18, resnet50) = 240 -> 680 under openvino
    fam = one(flips, device="cpu", batch_size=8, compiler="openvino", level="family")
    assert fam["n"] == 3 and fam["kendall_tau"] == exact(-1 / 3)
    assert fam["swapped_pairs"] == (
        "efficientnet > deit (beyond this run's noise); resnet > deit (beyond this run's noise)"
    )
    # batch 1: deit and resnet50 tie under identity (50 = 50): tau-b = 3 / sqrt(5 * 6)
    at1 = one(flips, device="cpu", batch_size=1, compiler="openvino", among="models", level="model")
    assert at1["kendall_tau"] == exact(3 / math.sqrt(30)) and at1["swapped"] == 1
    blocks = one(flips, batch_size=16, among="conv_block")
    assert blocks["kendall_tau"] is None and blocks["n"] == 3  # identity: all tied
    assert all(f["compiler"] != "tvm" for f in flips)
    assert not any(f["device"] == "gpu" for f in flips)  # no identity on the gpu


def test_kendall_tau_and_swapped_pairs():
    assert kendall_tau([3, 2, 1], [3, 2, 1]) == 1.0
    assert kendall_tau([3, 2, 1], [1, 2, 3]) == -1.0
    assert kendall_tau([1, 1], [1, 2]) is None
    assert swapped_pairs(["a", "b", "c"], [3, 2, 1], [1, 3, 2]) == [("a", "b"), ("a", "c")]
