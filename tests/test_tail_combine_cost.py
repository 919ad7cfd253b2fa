"""benchmarks/tail_combine_cost.py on CPU: its table's arithmetic, its arguments, and the forced cut it times on the
shapes tail_plan now runs whole."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import tail_combine_cost  # noqa: E402

import space.wgmma  # noqa: E402,F401  (registers it in sys.modules)


def test_the_table_gives_the_cuts_gain_and_the_combines_cost_in_key_tiles():
    row = {"shape": "b4-h16-n4096-d128-fp16-full", "config": "wgmma:x", "note": "",
           "us": {"whole": 800.0, "cut": 784.0, "cut+combine": 790.0}, "us_per_key_tile": 1.5,
           "samples": {"whole": [801.0, 800.0], "cut": [784.0, 785.0], "cut+combine": [790.0, 792.0]}}
    table = tail_combine_cost.markdown([row, {"shape": "b1-h64-n1024-d128-fp16-full", "config": "wgmma:y",
                                              "note": "not cut: nothing to time", "us": {}}])
    assert "| b4-h16-n4096-d128-fp16-full | 800.0 | 784.0 | 790.0 | +16.0 (+2.0%) | 6.0 | 4.0 |" in table
    assert "| b1-h64-n1024-d128-fp16-full | not cut: nothing to time |" in table
    assert "  - cut+combine: 790.0 / 792.0 us" in table


def test_the_vit_is_cut_only_with_the_combines_cost_left_out_and_the_cost_comes_back():
    w = sys.modules["space.wgmma"]  # what the loader's `from space.wgmma import tail_plan` reads
    vit = (4096, 132, 5)  # B64 H16 N577 at Br 192: 4096 tiles of 5 key tiles on 132 CTAs
    assert w.tail_plan(*vit) is None
    with tail_combine_cost.combine_cost_left_out():
        assert w.tail_plan(*vit) is not None
    assert w.TAIL_COMBINE_COST == 4 and w.tail_plan(*vit) is None


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--shape", "b4-h16-n4096-d128-fp16-full"],
                                  ["--shape", "a", "--shape", "b", "--config", "c"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit):
        tail_combine_cost.main(argv)
