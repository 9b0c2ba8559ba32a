"""The results index reader trusts nothing in the file: a gzip bomb, a file that is not gzip
or not JSON, text that would cost many times its size to parse, too many records or records
of another shape are each one ``BadIndex`` naming the problem, read in bounded memory."""

from __future__ import annotations

import gzip
import json
import resource
import time

import pytest

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.tracking import index


def _record(n: int = 0) -> dict:
    return {
        "run_id": f"{n:032x}",
        "experiment_id": "1",
        "start_time": 1_700_000_000_000,
        "params": {"compiler": "onnxruntime", "model": "conv_block", "device": "cpu"},
        "tags": {"ngraph.role": "cell", "ngraph.status.bs1": "OK"},
        "metrics": {"throughput.bs1": 1234.5, "latency_p99_ms.bs1": 0.75, "repetitions": 3},
    }


def _index(path, payload) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        json.dump(payload, handle, separators=(",", ":"))


def _bomb(path, mib: int) -> None:
    """``mib`` MiB of spaces in ~1 KB a MiB: gzip members, one after another."""
    path.write_bytes(gzip.compress(b" " * 2**20, 9) * mib)


def test_an_index_is_read_back(tmp_path):
    path = tmp_path / "cells.json.gz"
    records = [_record(n) for n in range(50)]
    _index(path, {"version": 1, "parent_run_id": "p", "runs": records})
    assert index.parse(path) == records


def test_a_gzip_bomb_is_refused_at_the_cap_in_bounded_memory(tmp_path):
    path = tmp_path / "cells.json.gz"
    _bomb(path, 1024)  # 1 GiB once decompressed, ~1 MB on disk
    assert path.stat().st_size < 2**21
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(index.BadIndex, match="more than 8,388,608 bytes once decompressed"):
        index.parse(path, 8 * 2**20)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 100, grown_mb


@pytest.mark.parametrize(
    "content, fragment",
    [
        (b"PK\x03\x04 a zip file", "not a gzip file"),
        (gzip.compress(b'{"version":1,"runs":[]}')[:20], "not a gzip file, or a damaged one"),
        (gzip.compress(b"{not json"), "not JSON"),
        (gzip.compress(b"\xff\xfe{}"), "not JSON"),
        (gzip.compress(b"[" * 100_000), "not JSON"),
        (gzip.compress(b"[1,2,3]"), "index version None is not 1"),
        (gzip.compress(b'{"version":2,"runs":[]}'), "index version 2 is not 1"),
        (gzip.compress(b'{"version":1,"runs":{}}'), "no list of runs"),
    ],
    ids=["zip", "truncated", "text", "encoding", "deep", "list", "version", "runs"],
)
def test_a_file_that_is_not_an_index_is_one_bad_index(tmp_path, content, fragment):
    path = tmp_path / "cells.json.gz"
    path.write_bytes(content)
    with pytest.raises(index.BadIndex, match=fragment) as caught:
        index.parse(path)
    assert isinstance(caught.value, NgraphError) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "change",
    [
        {"run_id": None},
        {"params": ["compiler"]},
        {"tags": {"ngraph.role": 1}},
        {"metrics": {"throughput.bs1": "fast"}},
        {"metrics": {"throughput.bs1": 10**400}},
        {"start_time": "yesterday"},
    ],
    ids=["run_id", "params", "tags", "metric", "huge", "start"],
)
def test_records_of_another_shape_are_refused(tmp_path, change):
    path = tmp_path / "cells.json.gz"
    _index(path, {"version": 1, "runs": [_record(0), {**_record(1), **change}]})
    with pytest.raises(index.BadIndex, match="is not a run's"):
        index.parse(path)


def test_text_that_would_cost_many_times_its_size_is_refused_before_parsing(tmp_path):
    path = tmp_path / "cells.json.gz"
    # 24 MB of empty lists: ~600 MB of Python objects once parsed
    path.write_bytes(gzip.compress(b'{"version":1,"runs":[' + b"[]," * 8_000_000 + b"[]]}"))
    start = time.monotonic()
    with pytest.raises(index.BadIndex, match="JSON values in .* bytes"):
        index.parse(path)
    assert time.monotonic() - start < 5


def test_too_many_records_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(index, "MAX_RECORDS", 10)
    path = tmp_path / "cells.json.gz"
    _index(path, {"version": 1, "runs": [_record(n) for n in range(11)]})
    with pytest.raises(index.BadIndex, match="11 records, more than the 10"):
        index.parse(path)


def test_the_cap_is_a_setting(monkeypatch):
    monkeypatch.delenv(index.MAX_BYTES_ENV, raising=False)
    assert index.max_bytes() == index.MAX_BYTES == 256 * 2**20
    monkeypatch.setenv(index.MAX_BYTES_ENV, "1G")
    assert index.max_bytes() == 2**30
    monkeypatch.setenv(index.MAX_BYTES_ENV, "lots")
    with pytest.raises(NgraphError, match=f"{index.MAX_BYTES_ENV}='lots' is not a size"):
        index.max_bytes()


def test_a_time_tag_that_is_not_a_time_is_no_current_index():
    assert index.is_current("FINISHED", {"ngraph.index.time": "1700000000000"})
    assert not index.is_current("FINISHED", {"ngraph.index.time": "soon"})
    assert not index.is_current("RUNNING", {"ngraph.index.time": "1700000000000"})
