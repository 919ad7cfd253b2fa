"""The landscape file: round trip, reviewable layout, and validation that names what is wrong."""
from __future__ import annotations

import json

import pytest

import space
from autotune.landscapes import landscape_file as landscape_mod
from autotune.landscapes.landscape_file import Landscape, LandscapeError, Row
from landscape_fixtures import ARCH, SMALL_SHAPE, small_landscape


def test_round_trip_keeps_header_and_rows(tmp_path):
    ls = small_landscape()
    path = ls.save(tmp_path / "l.json")
    back = landscape_mod.load(path)
    assert back.header == ls.header
    assert back.rows.keys() == ls.rows.keys()
    for key, row in ls.rows.items():
        got = back.rows[key]
        assert got.status == row.status and got.registers == row.registers and got.cubin_hash == row.cubin_hash
        if row.tflops is not None:
            assert got.tflops == pytest.approx(row.tflops, rel=1e-4)  # 5 significant digits on disk
    assert back.optimum == pytest.approx(ls.optimum, rel=1e-4)
    assert back.best.config_key == ls.best.config_key
    assert back.shape == SMALL_SHAPE and back.arch == ARCH and back.families == ("wgmma",)


def test_one_sorted_line_per_row_for_reviewable_diffs(tmp_path):
    ls = small_landscape()
    text = landscape_mod.dumps(ls)
    row_lines = [ln for ln in text.splitlines() if ln.startswith('{"config_key"')]
    assert len(row_lines) == len(ls.rows)
    keys = [json.loads(ln.rstrip(","))["config_key"] for ln in row_lines]
    assert keys == sorted(keys)
    data = json.loads(text)
    assert data["format"] == "autotune-landscape" and data["version"] == 1
    for field in landscape_mod.HEADER_REQUIRED:
        assert field in data["header"]


def test_counts_missing_and_completeness():
    ls = small_landscape()
    # the synthetic landscape holds the prefill slice (120 configs, its n_valid); today's space has the decode axes
    # softmax_reduce, exp2_fma, o_rescale=fused and tail_split too, whose configs it is missing
    full = len(ls.valid_configs())
    assert full == 3656 and len(ls.missing()) == full - 120 and not ls.is_complete
    # 28 valid configs under each of the 3 schedulers; 16 of them (overlap) also with o_rescale=before under grid and
    # lpt, 4 under persistent (one consumer warpgroup; the rest is over its register margin)
    assert ls.counts() == {"complete": 115, "compile_error": 1, "spilled": 1, "wrong": 1, "crashed": 1, "timeout": 1}
    first = sorted(ls.rows)[0]
    del ls.rows[first]
    assert first in [c.key for c in ls.missing()] and len(ls.missing()) == full - 119
    assert not ls.is_complete
    assert "119/120 rows" in ls.summary()


def _broken(mutate) -> str:
    ls = small_landscape()
    data = json.loads(landscape_mod.dumps(ls))
    mutate(data)
    with pytest.raises(LandscapeError) as err:
        landscape_mod.loads(json.dumps(data), "broken.json")
    return str(err.value)


def _complete_row(data) -> dict:
    return next(r for r in data["rows"] if r["status"] == "complete")


def test_validation_names_the_problem():
    assert "header lacks ['nvcc_version']" in _broken(lambda d: d["header"].pop("nvcc_version"))
    assert "not an autotune landscape" in _broken(lambda d: d.update(format="other"))
    assert "version 2" in _broken(lambda d: d.update(version=2))

    def bad_status(d):
        _complete_row(d)["status"] = "fast"
    assert "status 'fast'" in _broken(bad_status)

    def no_tflops(d):
        r = _complete_row(d)
        r.pop("tflops")
    assert "tflops > 0" in _broken(no_tflops)

    def twice(d):
        d["rows"].append(dict(d["rows"][0]))
    msg = _broken(twice)
    assert "has two rows" in msg and sorted(small_landscape().rows)[0] in msg

    def invalid_config(d):  # one consumer warpgroup cannot ping-pong: the pingpong rule rejects it
        r = next(r for r in d["rows"] if "consumer_wgs=2" in r["config_key"] and "pingpong=1" in r["config_key"])
        r["config_key"] = r["config_key"].replace("consumer_wgs=2", "consumer_wgs=1")
    msg = _broken(invalid_config)
    assert "invalid for" in msg and "consumer_wgs=1" in msg

    def no_report(d):
        _complete_row(d).pop("registers")
    assert "build report" in _broken(no_report)

    def unknown_field(d):
        _complete_row(d)["speed"] = 1
    assert "unknown fields ['speed']" in _broken(unknown_field)


def test_rows_of_another_family_are_refused():
    ls = Landscape(dict(small_landscape().header))
    config = space.default_config(SMALL_SHAPE.problem, ARCH, "mma_sync")
    ls.add(Row(config.key, "compile_error", reason="x"))
    with pytest.raises(LandscapeError, match="family 'mma_sync' is not among"):
        landscape_mod.validate(ls)


def test_loading_a_missing_file_names_it(tmp_path):
    with pytest.raises(LandscapeError, match="none.json: cannot read"):
        landscape_mod.load(tmp_path / "none.json")


def test_default_path_is_under_studies_landscapes(tmp_path):
    p = landscape_mod.default_path(SMALL_SHAPE, "NVIDIA H200", ("wgmma",), root=tmp_path)
    assert p == tmp_path / "studies" / "landscapes" / "h200-b1-h2-n256-d256-fp16-full-wgmma.json"
