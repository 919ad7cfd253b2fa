"""ptxas report parsing, on real `-Xptxas -v` output captured from nvcc 13.0 (tests/data/ptxas/README.md)."""
from __future__ import annotations

from pathlib import Path

import pytest

from autotune.build.ptxas import BuildReport, PtxasParseError, parse_functions, parse_report

DATA = Path(__file__).parent / "data" / "ptxas"
ENTRY = "flash_fwd_mma_sync"


def log(name: str) -> str:
    return (DATA / name).read_text()


def test_spilling_build_of_the_real_kernel():
    report = parse_report(log("sm90_default_spill.log"), ENTRY, compile_seconds=0.7)
    assert report == BuildReport(registers=255, spill_stores=40, spill_loads=52, stack_bytes=40, smem_static=0,
                                 compile_seconds=0.7)
    assert report.spilled


def test_heavy_spill_under_a_low_register_cap():
    report = parse_report(log("sm90_min_blocks4_heavy_spill.log"), ENTRY)
    assert (report.registers, report.spill_stores, report.spill_loads, report.stack_bytes) == (128, 460, 636, 304)
    assert report.spilled


@pytest.mark.parametrize("name, registers", [("sm90_static_smem.log", 226), ("sm103_static_smem.log", 198)])
def test_static_shared_memory_and_no_spill(name, registers):
    report = parse_report(log(name), ENTRY)
    assert report.registers == registers
    assert report.smem_static == 34816
    assert (report.spill_stores, report.spill_loads, report.stack_bytes) == (0, 0, 0)
    assert not report.spilled


def test_several_functions_in_one_log_are_kept_apart():
    text = log("toy_two_entries_sm90.log")
    functions = parse_functions(text)
    assert set(functions) == {ENTRY, "other", "_Z6helperPKfi"}
    assert parse_report(text, ENTRY) == BuildReport(146, 0, 0, 384, 256, 0.0)
    assert parse_report(text, "other") == BuildReport(40, 0, 0, 128, 0, 0.0)
    # a device function has properties but no register line of its own: it is not a report
    assert "registers" not in functions["_Z6helperPKfi"]
    with pytest.raises(PtxasParseError, match="_Z6helperPKfi"):
        parse_report(text, "_Z6helperPKfi")


def test_logs_of_two_builds_concatenated_keep_each_report():
    text = log("sm90_static_smem.log") + log("toy_two_entries_sm90.log")
    assert parse_report(text, "other").registers == 40
    # the same entry name twice: the later report wins
    assert parse_report(text, ENTRY).registers == 146


def test_missing_fields_read_as_zero():
    # what an entry without a properties section and without static smem looks like
    text = ("ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
            "ptxas info    : Used 32 registers, used 0 barriers\n")
    assert parse_report(text, "k") == BuildReport(32, 0, 0, 0, 0, 0.0)


def test_unknown_entry_names_what_the_log_has():
    with pytest.raises(PtxasParseError) as err:
        parse_report(log("sm90_static_smem.log"), "no_such_kernel")
    assert "no_such_kernel" in str(err.value) and ENTRY in str(err.value)
    with pytest.raises(PtxasParseError, match="none"):
        parse_report("", ENTRY)


def test_report_round_trips_through_a_dict():
    report = parse_report(log("sm90_default_spill.log"), ENTRY, 1.5)
    d = report.as_dict()
    assert d["spill_loads"] == 52 and d["compile_seconds"] == 1.5
    assert BuildReport.from_dict(d) == report
