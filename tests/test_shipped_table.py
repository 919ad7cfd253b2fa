"""One source of truth: docs/benchmarks.md's table of the shipped H200 configs is generated from
studies/tuned/h200.json (autotune/search/shipped_table.py, benchmarks/shipped_table.py), and a row edited by hand
in either place fails here until the page is regenerated."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from autotune.search import shipped_table
from autotune.search.doc_sections import replace_section

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "studies" / "tuned" / "h200.json"
PAGE = REPO / "docs" / "benchmarks.md"


def test_the_page_matches_the_shipped_file():
    assert shipped_table.matches(TABLE, PAGE), "docs/benchmarks.md: regenerate with python3 benchmarks/shipped_table.py"


def copies(tmp_path):
    table, page = tmp_path / "h200.json", tmp_path / "benchmarks.md"
    shutil.copy(TABLE, table)
    shutil.copy(PAGE, page)
    return table, page


def test_a_row_edited_by_hand_on_the_page_fails(tmp_path):
    table, page = copies(tmp_path)
    text = page.read_text()
    row = next(line for line in shipped_table.markdown(table).splitlines() if line.startswith("| b4-h16-n4096-d128-fp16-full"))
    cells = row.split(" | ")
    edited = " | ".join([*cells[:2], f"{float(cells[2]) + 20:.1f}", *cells[3:]])
    page.write_text(text.replace(row, edited))
    assert not shipped_table.matches(table, page)
    shipped_table.write(table, page)  # regenerated: equal again, the rest of the page untouched
    assert shipped_table.matches(table, page) and page.read_text() == text


def test_a_row_edited_by_hand_in_the_file_fails(tmp_path):
    table, page = copies(tmp_path)
    doc = json.loads(table.read_text())
    doc["rows"][0]["tflops"] += 12.5
    table.write_text(json.dumps(doc))
    assert not shipped_table.matches(table, page)
    check = [sys.executable, str(REPO / "benchmarks" / "shipped_table.py"), "--table", str(table), "--page", str(page),
             "--check"]
    done = subprocess.run(check, capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 1 and "differs" in done.stdout


def test_sections_replace_only_between_their_markers():
    text = "intro\n<!-- B -->\n\nold\n<!-- E -->\noutro\n"
    assert replace_section(text, "<!-- B -->", "<!-- E -->", "new\n") == "intro\n<!-- B -->\n\nnew\n\n<!-- E -->\noutro\n"
    assert replace_section("page", "<!-- B -->", "<!-- E -->", "x") == "page\n\n<!-- B -->\n\nx\n<!-- E -->\n"
