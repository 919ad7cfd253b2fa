"""The best-per-shape table: keep-the-faster, nothing lost, JSON round trips, next to Optuna's tables; and the
storage URL resolution order."""
from __future__ import annotations

import dataclasses
import json
import re
import sqlite3
from pathlib import Path

import pytest

import space
from autotune.store import storage_url
from autotune.store.best_table import SCHEMA_VERSION, TABLE, BestEntry, BestStore, StoreError
from pg_server import pg_server, postgres_url  # noqa: F401  (pytest fixtures: the PostgreSQL upgrade test)

SHAPE = space.Shape(batch=4, heads=16, seqlen_q=4096, head_dim=128)
CONFIG = space.default_config(SHAPE.problem, space.get_arch("sm_90"))
OTHER = CONFIG.replace(bc=64)  # (bc=128 was the default itself: OTHER must differ)
A100_CONFIG = space.default_config(SHAPE.problem, space.get_arch("sm_80"))  # rows must be valid for their arch


def entry(tflops: float, shape=SHAPE, config=CONFIG, gpu="NVIDIA H200", arch="sm_90", **kw) -> BestEntry:
    prov = dict(time_ms=shape.flops / tflops / 1e9, spread_ms=0.002, study="s", trial=7, kernel_source_hash="abc",
                nvcc_version="V13.0")
    prov.update(kw)
    return BestEntry.for_shape(shape, gpu, arch, config, tflops, **prov)


@pytest.fixture
def url(tmp_path) -> str:
    (tmp_path / "studies").mkdir()  # only the default storage's directory is created for the user
    return f"sqlite:///{tmp_path / 'studies' / 'autotune.db'}"


def test_record_inserts_then_keeps_the_faster_row(url):
    with BestStore(url) as store:
        assert store.record_best(entry(300.0)).action == "inserted"
        kept = store.record_best(entry(290.0, config=OTHER, trial=9))
        assert kept.action == "kept" and kept.entry.config_key == CONFIG.key and kept.entry.tflops == 300.0
        tie = store.record_best(entry(300.0, config=OTHER))
        assert tie.action == "kept" and tie.entry.config_key == CONFIG.key  # ties do not churn
        replaced = store.record_best(entry(320.0, config=OTHER, trial=11))
        assert replaced.action == "replaced" and replaced.previous.tflops == 300.0
        row = store.lookup("NVIDIA H200", "sm_90", SHAPE)
        assert (row.config_key, row.tflops, row.trial) == (OTHER.key, 320.0, 11)
        assert row.config == OTHER.as_dict() and space.Config.from_dict(row.config) == OTHER
        # the slower row was moved aside, not deleted
        moved = store.replaced_rows()
        assert [(m["config_key"], m["tflops"], m["replaced_by"]) for m in moved] == [(CONFIG.key, 300.0, "s #11")]


def test_a_later_pass_of_the_rows_own_study_replaces_it_whatever_the_figures(url):
    with BestStore(url) as store:
        store.record_best(entry(300.0, study="s", trial=7))
        # a slower row of the same study, recorded as superseding it (a campaign's second pass): replaces it
        later = entry(280.0, config=OTHER, study="s", trial=9, first_pass_tflops=290.0, second_pass_tflops=270.4)
        replaced = store.record_best(later, "s #9 (second pass)", supersedes_study="s")
        assert replaced.action == "replaced" and replaced.previous.tflops == 300.0
        row = store.lookup("NVIDIA H200", "sm_90", SHAPE)
        assert (row.config_key, row.tflops, row.trial, row.second_pass_tflops) == (OTHER.key, 280.0, 9, 270.4)
        assert [(m["tflops"], m["replaced_by"]) for m in store.replaced_rows()] == [(300.0, "s #9 (second pass)")]
        # the same row again (a retry whose commit went through) is kept: no churn
        assert store.record_best(later, supersedes_study="s").action == "kept"
        # another study's faster row still wins over the superseding one: only its own study's row gives way
        store.record_best(entry(400.0, study="elsewhere", trial=1))
        kept = store.record_best(entry(350.0, study="s", trial=10), supersedes_study="s")
        assert kept.action == "kept" and kept.entry.study == "elsewhere"
        assert len(store.replaced_rows()) == 2  # 280 (s #9) moved aside by the faster 400 of "elsewhere"


def test_row_keeps_provenance_and_utc_time(url):
    with BestStore(url) as store:
        store.record_best(entry(300.0))
        row = store.lookup("NVIDIA H200", "sm_90", SHAPE)
    assert (row.study, row.trial, row.kernel_source_hash, row.nvcc_version) == ("s", 7, "abc", "V13.0")
    assert row.created.utcoffset().total_seconds() == 0
    assert row.shape == SHAPE and row.family == CONFIG.family


def test_lookup_is_exact_per_key_column(url):
    with BestStore(url) as store:
        store.record_best(entry(300.0))
        assert store.lookup("NVIDIA H200", "sm_90", SHAPE) is not None
        for other in (dataclasses.replace(SHAPE, seqlen_q=2048), dataclasses.replace(SHAPE, causal=True),
                      dataclasses.replace(SHAPE, kv_heads=4), dataclasses.replace(SHAPE, seqlen_k=1024),
                      dataclasses.replace(SHAPE, batch=8), dataclasses.replace(SHAPE, dtype="bf16")):
            assert store.lookup("NVIDIA H200", "sm_90", other) is None, other
        assert store.lookup("NVIDIA H100", "sm_90", SHAPE) is None
        assert store.lookup("NVIDIA H200", "sm_100", SHAPE) is None


def test_all_rows_filters_and_sorts(url):
    with BestStore(url) as store:
        store.record_best(entry(300.0, shape=dataclasses.replace(SHAPE, seqlen_q=8192)))
        store.record_best(entry(310.0))
        store.record_best(entry(200.0, shape=dataclasses.replace(SHAPE, causal=True)))
        store.record_best(entry(100.0, gpu="NVIDIA A100-SXM4-80GB", arch="sm_80", config=A100_CONFIG))
        assert [r.seqlen for r in store.all_rows(gpu="h200", causal=False)] == [4096, 8192]
        assert [r.gpu_name for r in store.all_rows(arch="sm_80")] == ["NVIDIA A100-SXM4-80GB"]
        assert len(store.all_rows()) == 4
        assert [r.tflops for r in store.all_rows(causal=True)] == [200.0]
        with pytest.raises(ValueError, match="unknown column"):
            store.all_rows(seqlen_q=4096)


def test_export_is_sorted_indented_and_round_trips(url, tmp_path):
    rows = [entry(310.0), entry(300.0, shape=dataclasses.replace(SHAPE, seqlen_q=1024)),
            entry(150.0, gpu="NVIDIA A100", arch="sm_80", config=A100_CONFIG)]
    with BestStore(url) as store:
        for r in rows:
            store.record_best(r)
        path = tmp_path / "h200.json"
        assert store.export_json(path, gpu="h200") == 2
    text = path.read_text()
    doc = json.loads(text)
    assert doc["format"] == "autotune-best" and doc["schema_version"] == SCHEMA_VERSION
    assert [r["seqlen"] for r in doc["rows"]] == [1024, 4096]       # sorted by key
    assert text == json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"  # reviewable: stable text

    other = f"sqlite:///{tmp_path / 'other.db'}"
    with BestStore(other) as fresh:
        counts = fresh.import_json(path)
        assert (counts.inserted, counts.replaced, counts.kept) == (2, 0, 0)
        back = fresh.all_rows()
    assert [r.to_json() for r in back] == doc["rows"]
    # exporting the imported table gives the same file
    with BestStore(other) as fresh:
        fresh.export_json(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text() == text


def test_import_never_loses_a_faster_existing_row(url, tmp_path):
    path = tmp_path / "shipped.json"
    with BestStore(f"sqlite:///{tmp_path / 'ship.db'}") as ship:
        ship.record_best(entry(250.0, config=OTHER))                                  # slower than ours
        ship.record_best(entry(400.0, shape=dataclasses.replace(SHAPE, seqlen_q=1024)))  # faster than ours
        ship.record_best(entry(100.0, shape=dataclasses.replace(SHAPE, seqlen_q=512)))   # new key
        ship.export_json(path)
    with BestStore(url) as store:
        store.record_best(entry(300.0))
        store.record_best(entry(350.0, shape=dataclasses.replace(SHAPE, seqlen_q=1024), config=OTHER))
        counts = store.import_json(path)
        assert (counts.inserted, counts.replaced, counts.kept) == (1, 1, 1)
        by_seqlen = {r.seqlen: r for r in store.all_rows()}
        assert by_seqlen[4096].tflops == 300.0 and by_seqlen[4096].config_key == CONFIG.key
        assert by_seqlen[1024].tflops == 400.0 and by_seqlen[512].tflops == 100.0
        moved = store.replaced_rows()
        assert [(m["seqlen"], m["tflops"], m["replaced_by"]) for m in moved] == [(1024, 350.0, "import shipped.json")]


def _exported(tmp_path) -> dict:
    """An export of two good rows: rows[0] is seqlen 1024, rows[1] seqlen 4096 (sorted by key)."""
    src = tmp_path / "good.json"
    with BestStore(f"sqlite:///{tmp_path / 'src.db'}") as s:
        s.record_best(entry(300.0))
        s.record_best(entry(200.0, shape=dataclasses.replace(SHAPE, seqlen_q=1024)))
        s.export_json(src)
    return json.loads(src.read_text())


def _mutated(tmp_path, mutate) -> Path:
    """The export of `_exported`, changed by `mutate(doc)`, written to bad.json."""
    doc = _exported(tmp_path)
    mutate(doc)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    return bad


@pytest.mark.parametrize("mutate,expect", [
    (lambda d: d.update(schema_version=SCHEMA_VERSION + 1), "schema_version"),
    (lambda d: d.update(format="something-else"), "format"),
    (lambda d: d.update(rows={"a": 1}), "expected a list"),
])
def test_import_refuses_a_file_that_is_not_an_export_before_writing_anything(url, tmp_path, mutate, expect):
    bad = _mutated(tmp_path, mutate)
    with BestStore(url) as store:
        with pytest.raises(StoreError, match=expect):
            store.import_json(bad)
        assert store.all_rows() == []  # checked as a file first: nothing half-imported


def _set_config(d, config):
    d["rows"][0].update(config_key=config.key, config=config.as_dict(), family=config.family)


@pytest.mark.parametrize("mutate,expect", [
    (lambda d: d["rows"][0].pop("tflops"), r"rows\[0\]: missing field\(s\) \['tflops'\]"),
    (lambda d: d["rows"][0].update(head_dim="128"), r"rows\[0\]: head_dim: expected an integer"),
    (lambda d: d["rows"][0].update(tflops=-5.0), r"rows\[0\]: tflops: expected a positive"),
    (lambda d: d["rows"][0].update(tflops="fast"), r"rows\[0\]: tflops: expected a positive"),
    (lambda d: d["rows"][0].update(time_ms=float("nan")), r"rows\[0\]: time_ms: expected a positive finite"),
    (lambda d: d["rows"][0].update(colour="red"), r"rows\[0\]: unknown field\(s\) \['colour'\]"),
    (lambda d: d["rows"][0].update(config_key="wgmma:nope=1"), r"rows\[0\]: config_key 'wgmma:nope=1' not understood"),
    (lambda d: d["rows"][0].update(config_key="nofamily:br=64"), r"rows\[0\]: config_key .* not understood"),
    (lambda d: d["rows"][0].update(config=OTHER.as_dict()), r"rows\[0\]: config contradicts config_key .*bc"),
    (lambda d: d["rows"][0].update(family="mma_sync"), r"rows\[0\]: family 'mma_sync' contradicts"),
    (lambda d: d["rows"][0].update(arch="sm_80"), r"rows\[0\]: .* cannot run on sm_80"),
    (lambda d: d["rows"][0].update(arch="sm_7"), r"rows\[0\]: arch"),
    (lambda d: d["rows"][0].update(kv_heads=3), r"rows\[0\]: not a valid shape"),
    (lambda d: _set_config(d, A100_CONFIG.replace(br=64, warps_m=8)), r"rows\[0\]: .* cannot run on sm_90"),
])
def test_import_skips_a_bad_row_by_its_index_and_keeps_the_good_ones(url, tmp_path, mutate, expect):
    bad = _mutated(tmp_path, mutate)
    with BestStore(url) as store:
        counts = store.import_json(bad)
        assert (counts.inserted, len(counts.skipped)) == (1, 1), counts
        assert re.search(expect, counts.skipped[0]) and str(bad) in counts.skipped[0]
        assert [r.seqlen for r in store.all_rows()] == [4096]  # the good row is kept


def test_import_skips_a_repeated_key_and_keeps_the_first(url, tmp_path):
    bad = _mutated(tmp_path, lambda d: d["rows"].append(dict(d["rows"][0], tflops=999.0)))
    with BestStore(url) as store:
        counts = store.import_json(bad)
        assert counts.inserted == 2 and len(counts.skipped) == 1
        assert "rows[2] has the same key as rows[0]" in counts.skipped[0]
        assert sorted(r.tflops for r in store.all_rows()) == [200.0, 300.0]


def test_a_bad_stored_row_costs_that_row_not_the_table(url):
    with BestStore(url) as store:
        store.record_best(entry(300.0))
        store.record_best(entry(200.0, shape=dataclasses.replace(SHAPE, seqlen_q=1024)))
    with sqlite3.connect(storage_url.sqlite_path(url)) as con:  # edited by hand, or by another version
        con.execute(f"update {TABLE} set tflops=-5 where seqlen=1024")
    with BestStore(url, read_only=True) as store:
        assert [r.seqlen for r in store.all_rows()] == [4096]
        assert len(store.skipped) == 1 and "seqlen 1024" in store.skipped[0] and "tflops" in store.skipped[0]


def test_import_names_unreadable_files(url, tmp_path):
    with BestStore(url) as store:
        with pytest.raises(StoreError, match="cannot read"):
            store.import_json(tmp_path / "missing.json")
        (tmp_path / "x.json").write_text("{not json")
        with pytest.raises(StoreError, match="not valid JSON"):
            store.import_json(tmp_path / "x.json")


def test_lives_beside_optuna_without_touching_its_tables(url):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage_url.prepare(url)  # SQLite creates the file, not its directory
    study = optuna.create_study(study_name="keep-me", storage=url, direction="maximize")
    study.enqueue_trial({"x": 1})
    path = storage_url.sqlite_path(url)

    def tables():
        with sqlite3.connect(path) as con:
            return {name: con.execute(f"select count(*) from {name}").fetchone()[0]
                    for (name,) in con.execute("select name from sqlite_master where type='table'")}

    before = tables()
    with BestStore(url) as store:
        store.record_best(entry(300.0))
        assert store.schema_version == SCHEMA_VERSION
    after = tables()
    ours = {TABLE, f"{TABLE}_replaced", "autotune_meta"}
    assert ours.isdisjoint(before) and ours <= set(after)
    assert {k: v for k, v in after.items() if k not in ours} == before  # Optuna's tables: same tables, same rows
    with sqlite3.connect(path) as con:
        assert con.execute("select value from autotune_meta where key=?", (f"{TABLE}.schema_version",)).fetchone() \
            == (str(SCHEMA_VERSION),)
    assert optuna.load_study(study_name="keep-me", storage=url).trials[0].state.name == "WAITING"


def test_refuses_a_newer_schema(url):
    BestStore(url).close()
    with sqlite3.connect(storage_url.sqlite_path(url)) as con:
        con.execute("update autotune_meta set value=? where key=?", (str(SCHEMA_VERSION + 1), f"{TABLE}.schema_version"))
    with pytest.raises(StoreError, match="newer than this autotune"):
        BestStore(url)


HASH = "ab" * 32


def _older_schema(url: str, version: int) -> None:
    """Make the tables at `url` (SQLite) what schema `version` wrote: without the columns later versions added (nor
    them in the unique key), schema row `version`; every row and id kept."""
    from autotune.store.best_table import ADDED_COLUMNS

    dropped = [c for v, cols in ADDED_COLUMNS.items() if v > version for c in cols]
    with sqlite3.connect(storage_url.sqlite_path(url)) as con:
        for table in (TABLE, f"{TABLE}_replaced"):
            sql = con.execute("select sql from sqlite_master where name=?", (table,)).fetchone()[0]
            for c in dropped:
                sql = re.sub(rf"\n\s*{c} [^\n]*,", "", sql).replace(f", {c}", "")
            assert all(c not in sql for c in dropped), sql
            kept = [r[1] for r in con.execute(f"pragma table_info({table})") if r[1] not in dropped]
            con.execute(sql.replace(f"CREATE TABLE {table} ", "CREATE TABLE old_schema ", 1))
            con.execute(f"insert into old_schema select {', '.join(kept)} from {table}")
            con.execute(f"drop table {table}")
            con.execute(f"alter table old_schema rename to {table}")
        con.execute("update autotune_meta set value=? where key=?", (str(version), f"{TABLE}.schema_version"))


def _as_version_1(url: str) -> None:
    _older_schema(url, 1)


def test_a_version_1_table_reads_as_it_is_and_migrates_when_opened_for_writing(url):
    with BestStore(url) as store:
        store.record_best(entry(300.0))
        store.record_best(entry(310.0))  # 300 moved to the replaced table
    _as_version_1(url)
    with BestStore(url, read_only=True) as store:  # the runtime, `best`, `export`: nothing written
        (old,) = store.all_rows()
        assert (old.tflops, old.cubin_hash, old.study) == (310.0, None, "s")
        assert store.lookup(old.gpu_name, old.arch, SHAPE) == old
        assert [r["tflops"] for r in store.replaced_rows()] == [300.0]
    with sqlite3.connect(storage_url.sqlite_path(url)) as con:
        assert "cubin_hash" not in {r[1] for r in con.execute(f"pragma table_info({TABLE})")}  # still version 1
    with BestStore(url) as store:  # a search storing its winner: migrated, old rows kept as they were
        assert store.schema_version == SCHEMA_VERSION
        assert store.all_rows() == [old]
        store.record_best(entry(320.0, cubin_hash=HASH))
        (new,) = store.all_rows()
        assert new.cubin_hash == HASH and [r["cubin_hash"] for r in store.replaced_rows()] == [None, None]
    with BestStore(url, read_only=True) as store:
        assert store.all_rows()[0].cubin_hash == HASH


def test_a_row_with_a_malformed_cubin_hash_is_not_used():
    from autotune.store.best_table import row_problem

    assert row_problem(entry(300.0, cubin_hash=HASH)) is None
    assert "cubin_hash" in row_problem(entry(300.0, cubin_hash="not-a-hash"))


def test_entry_validation():
    for bad in (float("nan"), float("inf"), 0.0, -5.0):
        with pytest.raises(ValueError, match="tflops"):
            BestEntry.for_shape(SHAPE, "NVIDIA H200", "sm_90", CONFIG, bad)


# ---- storage URL resolution -----------------------------------------------------------------------------------

def test_storage_url_order(monkeypatch, tmp_path):
    monkeypatch.delenv(storage_url.ENV_VAR, raising=False)
    default = storage_url.resolve_storage_url(None)
    assert default == storage_url.default_storage_url()
    assert default.startswith("sqlite:///") and default.endswith("/studies/autotune.db")

    monkeypatch.setenv(storage_url.ENV_VAR, "sqlite:///from-env.db")
    assert storage_url.resolve_storage_url(None) == "sqlite:///from-env.db"          # env beats the default
    assert storage_url.resolve_storage_url("sqlite:///explicit.db") == "sqlite:///explicit.db"  # argument beats env

    monkeypatch.setenv(storage_url.ENV_VAR, "  ")
    with pytest.raises(ValueError, match=r"\$AUTOTUNE_STORAGE"):
        storage_url.resolve_storage_url(None)
    with pytest.raises(ValueError, match="--storage"):
        storage_url.resolve_storage_url("")


def test_default_root_is_the_checkout_when_running_from_source():
    root = storage_url.default_root()
    assert (root / "autotune" / "store" / "storage_url.py").is_file() and (root / "studies").is_dir()


def test_default_root_falls_back_to_cwd(monkeypatch, tmp_path):
    fake_module_dir = tmp_path / "site-packages" / "autotune" / "store"
    fake_module_dir.mkdir(parents=True)
    monkeypatch.setattr(storage_url, "__file__", str(fake_module_dir / "storage_url.py"))
    monkeypatch.chdir(tmp_path)
    assert storage_url.default_root() == tmp_path
    assert storage_url.default_storage_url() == f"sqlite:///{tmp_path}/studies/autotune.db"


def test_sqlite_helpers(tmp_path):
    url = f"sqlite:///{tmp_path / 'a' / 'b' / 'x.db'}"
    assert storage_url.sqlite_path(url) == tmp_path / "a" / "b" / "x.db"
    assert storage_url.sqlite_path("sqlite://") is None and storage_url.sqlite_path("sqlite:///:memory:") is None
    assert storage_url.sqlite_path("postgresql://u:secret@host/db") is None
    assert "secret" not in storage_url.describe("postgresql://u:secret@host/db")


# ---- causal alignment in the key (schema 3) -------------------------------------------------------------------

DECODE = space.Shape(batch=32, heads=32, kv_heads=8, seqlen_q=4, seqlen_k=4096, head_dim=128, dtype="bf16",
                     causal=True)
LOWER_RIGHT = dataclasses.replace(DECODE, causal_align="lower_right")
DECODE_CONFIG = space.default_config_for_shape(DECODE, space.get_arch("sm_90"))


def test_the_alignment_is_part_of_the_shape_key_only_where_it_changes_the_function():
    assert LOWER_RIGHT != DECODE and LOWER_RIGHT.key == DECODE.key + "-lower-right"
    assert DECODE.key == "b32-h32-kv8-n4-k4096-d128-bf16-causal"  # upper-left keys (study names) as before
    square = space.Shape(seqlen_q=512, causal=True, causal_align="lower_right")
    assert square == space.Shape(seqlen_q=512, causal=True) and square.causal_align == "upper_left"
    unmasked = space.Shape(seqlen_q=4, seqlen_k=4096, causal_align="lower_right")
    assert unmasked == space.Shape(seqlen_q=4, seqlen_k=4096)
    with pytest.raises(ValueError, match="causal_align"):
        space.Shape(seqlen_q=4, seqlen_k=64, causal=True, causal_align="bottom_right")


def test_entries_key_by_alignment_and_keep_one_spelling_for_square_shapes():
    lr = entry(300.0, shape=LOWER_RIGHT, config=DECODE_CONFIG)
    ul = entry(300.0, shape=DECODE, config=DECODE_CONFIG)
    assert lr.causal_align == "lower_right" and lr.key != ul.key and lr.shape == LOWER_RIGHT
    square = dataclasses.replace(entry(300.0, shape=dataclasses.replace(SHAPE, causal=True)), causal_align="lower_right")
    assert square.causal_align == "upper_left"
    with pytest.raises(ValueError, match="causal_align"):
        dataclasses.replace(lr, causal_align="lower-right")


def test_both_alignments_of_one_shape_are_two_rows(url):
    with BestStore(url) as store:
        assert store.record_best(entry(300.0, shape=DECODE, config=DECODE_CONFIG)).action == "inserted"
        assert store.record_best(entry(100.0, shape=LOWER_RIGHT, config=DECODE_CONFIG)).action == "inserted"
        assert store.lookup("NVIDIA H200", "sm_90", LOWER_RIGHT).tflops == 100.0
        assert store.lookup("NVIDIA H200", "sm_90", DECODE).tflops == 300.0
        assert [r.causal_align for r in store.all_rows(causal_align="lower_right")] == ["lower_right"]


def test_export_carries_the_alignment_and_an_older_export_reads_as_upper_left(url, tmp_path):
    with BestStore(url) as store:
        store.record_best(entry(300.0, shape=LOWER_RIGHT, config=DECODE_CONFIG))
        store.export_json(tmp_path / "t.json")
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["rows"][0]["causal_align"] == "lower_right"
    del doc["rows"][0]["causal_align"]  # what schema 2 wrote: no such field
    doc["schema_version"] = 2
    (tmp_path / "old.json").write_text(json.dumps(doc))
    from autotune.store.best_table import read_export

    (old,) = read_export(tmp_path / "old.json").entries
    assert old.causal_align == "upper_left" and old.shape == DECODE
    doc["rows"][0]["causal_align"] = "bottom_right"
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    assert "causal_align" in read_export(tmp_path / "bad.json").skipped[0]


def _rows_of_every_kind(store) -> None:
    store.record_best(entry(300.0))                                          # unmasked, Nq == Nk
    store.record_best(entry(280.0, shape=dataclasses.replace(SHAPE, causal=True)))  # causal square
    store.record_best(entry(90.0, shape=DECODE, config=DECODE_CONFIG, cubin_hash=HASH))  # causal, Nq != Nk
    store.record_best(entry(95.0, shape=DECODE, config=DECODE_CONFIG))       # 90 moved to the replaced table


def test_a_version_2_table_upgrades_with_every_row_upper_left_and_then_takes_lower_right_rows(url):
    with BestStore(url) as store:
        _rows_of_every_kind(store)
        before, replaced = store.all_rows(), store.replaced_rows()
    _older_schema(url, 2)
    with sqlite3.connect(storage_url.sqlite_path(url)) as con:
        ids = con.execute(f"select id, seqlen, causal from {TABLE} order by id").fetchall()
        assert "causal_align" not in {r[1] for r in con.execute(f"pragma table_info({TABLE})")}
    with BestStore(url, read_only=True) as store:  # read as it is: upper-left rows, nothing written
        assert store.all_rows() == before and store.replaced_rows() == replaced
        assert store.lookup("NVIDIA H200", "sm_90", DECODE).tflops == 95.0
        assert store.lookup("NVIDIA H200", "sm_90", LOWER_RIGHT) is None  # never an upper-left row
        assert store.all_rows(causal_align="lower_right") == [] and len(store.all_rows(causal_align="upper_left")) == 3
    with BestStore(url) as store:  # opened for writing: migrated, every row and id kept
        assert store.schema_version == SCHEMA_VERSION
        assert store.all_rows() == before and store.replaced_rows() == replaced
        assert store.record_best(entry(120.0, shape=LOWER_RIGHT, config=DECODE_CONFIG)).action == "inserted"
        assert store.record_best(entry(96.0, shape=DECODE, config=DECODE_CONFIG)).action == "replaced"
        assert len(store.all_rows()) == 4
    with sqlite3.connect(storage_url.sqlite_path(url)) as con:
        assert con.execute(f"select id, seqlen, causal from {TABLE} where id <= ? order by id",
                           (ids[-1][0],)).fetchall() == ids
        assert not con.execute("select name from sqlite_master where name like '%rebuilt%'").fetchall()


def test_a_version_1_table_upgrades_through_both_versions(url):
    with BestStore(url) as store:
        _rows_of_every_kind(store)
        before = store.all_rows()
    _older_schema(url, 1)
    with BestStore(url) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert [dataclasses.replace(r, cubin_hash=None) for r in before] == store.all_rows()
        assert store.record_best(entry(120.0, shape=LOWER_RIGHT, config=DECODE_CONFIG)).action == "inserted"


def test_processes_opening_a_version_2_table_at_once_migrate_it_once(url):
    import threading

    with BestStore(url) as store:
        _rows_of_every_kind(store)
        before = store.all_rows()
    _older_schema(url, 2)
    barrier, errors = threading.Barrier(4), []

    def open_it():
        try:
            barrier.wait()
            with BestStore(url) as store:
                assert store.schema_version == SCHEMA_VERSION and store.all_rows() == before
        except Exception as e:  # noqa: BLE001  (reported by the test)
            errors.append(f"{type(e).__name__}: {e}")
    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    with BestStore(url) as store:
        assert store.record_best(entry(120.0, shape=LOWER_RIGHT, config=DECODE_CONFIG)).action == "inserted"


def test_a_version_2_table_upgrades_on_postgresql(postgres_url):
    from sqlalchemy import create_engine, text

    with BestStore(postgres_url) as store:
        _rows_of_every_kind(store)
        before, replaced = store.all_rows(), store.replaced_rows()
    engine = create_engine(postgres_url)
    with engine.begin() as con:  # what schema 2 made: no causal_align, the key without it
        con.execute(text(f"alter table {TABLE} drop constraint uq_{TABLE}_shape"))
        for table in (TABLE, f"{TABLE}_replaced"):
            con.execute(text(f"alter table {table} drop column causal_align"))
        con.execute(text(f"alter table {TABLE} add constraint uq_{TABLE}_shape unique (gpu_name, arch, dtype, "
                         "head_dim, causal, seqlen, seqlen_k, batch, heads, kv_heads)"))
        con.execute(text(f"update autotune_meta set value='2' where key='{TABLE}.schema_version'"))
    engine.dispose()
    with BestStore(postgres_url, read_only=True) as store:
        assert store.all_rows() == before and store.lookup("NVIDIA H200", "sm_90", LOWER_RIGHT) is None
    with BestStore(postgres_url) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert store.all_rows() == before and store.replaced_rows() == replaced
        assert store.record_best(entry(120.0, shape=LOWER_RIGHT, config=DECODE_CONFIG)).action == "inserted"
    with BestStore(postgres_url) as store:  # opened again: nothing left to migrate
        assert len(store.all_rows()) == 4


# ---- a campaign row's two passes (schema 4) --------------------------------------------------------------------

PASSES = dict(first_pass_tflops=301.0, second_pass_tflops=299.0, runner_up_config_key=OTHER.key,
              runner_up_first_tflops=302.5, runner_up_second_tflops=290.0)


def test_a_row_keeps_both_passes_through_the_store_and_the_export(url, tmp_path):
    with BestStore(url) as store:
        store.record_best(entry(300.0, **PASSES))
        row = store.lookup("NVIDIA H200", "sm_90", SHAPE)
        store.export_json(tmp_path / "t.json")
    assert {k: getattr(row, k) for k in PASSES} == PASSES
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["schema_version"] == SCHEMA_VERSION == 4 and {k: doc["rows"][0][k] for k in PASSES} == PASSES
    other = f"sqlite:///{tmp_path / 'other.db'}"
    with BestStore(other) as fresh:
        fresh.import_json(tmp_path / "t.json")
        assert fresh.all_rows()[0] == row
    with BestStore(url) as store:  # a faster row replaces it: the passes move aside with it
        store.record_best(entry(310.0))
        (moved,) = store.replaced_rows()
        assert moved["second_pass_tflops"] == 299.0 and store.all_rows()[0].second_pass_tflops is None


def test_a_version_3_table_upgrades_with_rows_without_passes(url):
    with BestStore(url) as store:
        _rows_of_every_kind(store)
        store.record_best(entry(120.0, shape=LOWER_RIGHT, config=DECODE_CONFIG))
        before, replaced = store.all_rows(), store.replaced_rows()
    _older_schema(url, 3)
    with sqlite3.connect(storage_url.sqlite_path(url)) as con:
        assert "second_pass_tflops" not in {r[1] for r in con.execute(f"pragma table_info({TABLE})")}
    with BestStore(url, read_only=True) as store:
        assert store.all_rows() == before and all(r.second_pass_tflops is None for r in before)
    with BestStore(url) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert store.all_rows() == before and store.replaced_rows() == replaced
        store.record_best(entry(400.0, **PASSES))
        assert store.lookup("NVIDIA H200", "sm_90", SHAPE).runner_up_config_key == OTHER.key


@pytest.mark.parametrize("change,message", [
    ({"second_pass_tflops": -1.0}, "second_pass_tflops"), ({"first_pass_tflops": float("nan")}, "first_pass_tflops"),
    ({"runner_up_config_key": "wgmma:nope=1"}, "runner_up_config_key"),
    ({"runner_up_config_key": None}, "without runner_up_config_key")])
def test_a_row_with_malformed_passes_is_not_used(change, message):
    from autotune.store.best_table import row_problem

    assert row_problem(entry(300.0, **PASSES)) is None
    assert message in row_problem(entry(300.0, **{**PASSES, **change}))
