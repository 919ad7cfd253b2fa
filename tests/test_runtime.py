"""The runtime on CPU: lookup order (storage → shipped → nearest → another GPU of the arch → heuristic) on a fixture database, the
nearest-neighbour metric and its tie-breaks, invalid rows skipped, the memo (no DB work when warm), input errors
naming the argument, the custom op's fake implementation and a fullgraph torch.compile trace."""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

import space
from autotune.runtime import lookup as runtime
from autotune.store import storage_url
from autotune.launch.params import FlashFwdParams
from autotune.store.best_table import BestEntry, BestStore

torch = pytest.importorskip("torch")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import autotune  # noqa: E402
from autotune.runtime import attention_op as op  # noqa: E402

GPU = "FAKE GPU (tests only)"
ARCH = space.get_arch("sm_90")
SM86 = space.get_arch("sm_86")
PROBLEM = space.Problem(head_dim=128, dtype="fp16", causal=False)
DEFAULT = space.default_config(PROBLEM, ARCH)  # the heuristic (wgmma family on sm_90)
MMA = space.default_config(PROBLEM, ARCH, "mma_sync")
# Distinct valid configs, so that each test can tell which row was chosen.
CFG_A = MMA.replace(br=64, bc=64, warps_m=4)
CFG_B = MMA.replace(br=128, bc=32, warps_m=8)
CFG_C = MMA.replace(kv_buffering="shared")
CFG_D = MMA.replace(min_blocks=2, bc=32)
# Valid on sm_90, too much shared memory for sm_86's 99 KB opt-in limit.
BIG_SMEM = MMA.replace(br=64, bc=128, kv_buffering="double")
FIXTURE_TABLE = Path(__file__).parent / "data" / "tuned" / "fake_gpu.json"


def shape(n=4096, batch=4, heads=16, kv_heads=None, nk=None, **kw) -> space.Shape:
    return space.Shape(batch=batch, heads=heads, seqlen_q=n, seqlen_k=nk, kv_heads=kv_heads, head_dim=128,
                       dtype="fp16", causal=False, **kw)


def entry(s: space.Shape, config: space.Config, tflops=1.0, gpu=GPU, arch=ARCH, **kw) -> BestEntry:
    return BestEntry.for_shape(s, gpu, arch.name, config, tflops, study="fixture", trial=7, **kw)


@pytest.fixture(autouse=True)
def fresh_caches(monkeypatch):
    monkeypatch.delenv(storage_url.ENV_VAR, raising=False)
    op.clear_caches()
    yield
    op.clear_caches()


@pytest.fixture
def db(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'user.db'}"


def store_rows(url: str, *entries: BestEntry) -> None:
    with BestStore(url) as s:
        for e in entries:
            assert s.record_best(e).action == "inserted"


def shipped_dir(tmp_path, *entries: BestEntry, name="h200.json") -> Path:
    """A tables directory holding one file written by the store's own export (the shipped format)."""
    d = tmp_path / "tuned"
    d.mkdir(exist_ok=True)
    staging = f"sqlite:///{tmp_path / ('staging-' + name + '.db')}"
    store_rows(staging, *entries)
    with BestStore(staging) as s:
        s.export_json(d / name)
    return d


def select(s, url, tables=None, arch=ARCH, gpu=GPU):
    return runtime.select_config(s, gpu, arch, url, tables_dir=tables)


# ---- lookup order -----------------------------------------------------------------------------------------

def test_storage_exact_row_wins_over_shipped_exact_row(tmp_path, db):
    store_rows(db, entry(shape(), CFG_A, tflops=100))
    tables = shipped_dir(tmp_path, entry(shape(), CFG_B, tflops=500))  # faster, but the user's row comes first
    sel = select(shape(), db, tables)
    assert (sel.source, sel.config, sel.distance) == ("storage", CFG_A, 0.0)
    assert sel.row.study == "fixture" and sel.provenance["tflops"] == 100
    assert sel.origin == storage_url.describe(db)


def test_shipped_exact_row_when_storage_has_none(tmp_path, db):
    store_rows(db, entry(shape(n=1024), CFG_A))
    tables = shipped_dir(tmp_path, entry(shape(), CFG_B))
    sel = select(shape(), db, tables)
    assert (sel.source, sel.config, sel.distance) == ("shipped", CFG_B, 0.0)
    assert sel.origin == str(tables / "h200.json")


def test_nearest_when_no_exact_row(tmp_path, db):
    store_rows(db, entry(shape(n=1024), CFG_A))
    tables = shipped_dir(tmp_path, entry(shape(n=8192), CFG_B))
    sel = select(shape(n=6000), db, tables)
    assert (sel.source, sel.config, sel.row.seqlen) == ("nearest", CFG_B, 8192)
    assert sel.distance == pytest.approx(abs(runtime.math.log2(6000 / 8192)))


def test_heuristic_when_no_row_matches_gpu_arch_dtype_head_dim_or_causal(tmp_path, db):
    s = shape()
    others = [
        entry(s, CFG_A, gpu="NVIDIA A100"),
        entry(s, CFG_A, arch=space.get_arch("sm_100")),
        entry(space.Shape(4, 16, 4096, head_dim=128, dtype="bf16"), CFG_A),
        entry(space.Shape(4, 16, 4096, head_dim=64), MMA.replace(bc=64)),
        entry(space.Shape(4, 16, 4096, head_dim=128, causal=True), CFG_A),
    ]
    store_rows(db, *others)
    # another GPU's shipped row of the same arch stands in (the next test), so the shipped file holds it on sm_100
    tables = shipped_dir(tmp_path, entry(s, CFG_A, gpu="NVIDIA A100", arch=space.get_arch("sm_100")), *others[1:])
    sel = select(s, db, tables)
    assert sel.source == "heuristic" and sel.row is None and sel.distance is None
    assert sel.config == space.default_config(s.problem, ARCH)


def test_another_gpus_shipped_row_of_the_same_arch_stands_in_before_the_heuristic(tmp_path, db):
    from autotune.runtime.benchmark_mode import needs_measuring

    sibling = "NVIDIA H200"  # the lookup runs as GPU (FAKE GPU), of the same arch as the H200 rows
    tables = shipped_dir(tmp_path, entry(shape(), CFG_B, gpu=sibling), entry(shape(n=8192), CFG_C, gpu=sibling),
                         entry(shape(n=6000), CFG_D, gpu="NVIDIA B200", arch=space.get_arch("sm_100")))
    exact = select(shape(), db, tables)
    assert (exact.source, exact.config, exact.distance, exact.row.gpu_name) == ("same_arch", CFG_B, 0.0, sibling)
    assert "tuned on NVIDIA H200, another GPU of sm_90" in exact.explain() and "exact shape" in exact.explain()
    near = select(shape(n=6000), db, tables)  # the sm_100 row of that very shape is not a stand-in
    assert (near.source, near.config, near.row.seqlen) == ("same_arch", CFG_C, 8192)
    assert near.distance == pytest.approx(abs(runtime.math.log2(6000 / 8192))) and "nearest" in near.explain()
    assert needs_measuring(exact) and needs_measuring(near)  # a guess: benchmark mode still measures it
    # a neighbour row of this GPU comes before another GPU's neighbour row, but not before its exact row
    store_rows(db, entry(shape(n=1024), CFG_A))
    runtime.clear_caches()
    assert (select(shape(n=6000), db, tables).source, select(shape(n=6000), db, tables).config) == ("nearest", CFG_A)
    assert (select(shape(), db, tables).source, select(shape(), db, tables).config) == ("same_arch", CFG_B)


def test_a_few_rows_of_this_gpu_keep_another_gpus_exact_rows_for_its_other_shapes(tmp_path, db):
    """The H100's short table beside the H200's: the H100's own exact rows first, the H200's exact rows for the
    H100's other shapes, the H100's neighbours only for shapes neither table holds."""
    sibling = "NVIDIA H200"
    tables = shipped_dir(tmp_path, entry(shape(), CFG_B, gpu=sibling), entry(shape(n=8192), CFG_C, gpu=sibling))
    shipped_dir(tmp_path, entry(shape(), CFG_A), name="h100.json")  # GPU's own row of the first shape
    assert (select(shape(), db, tables).source, select(shape(), db, tables).config) == ("shipped", CFG_A)
    assert (select(shape(n=8192), db, tables).source, select(shape(n=8192), db, tables).config) == ("same_arch", CFG_C)
    near = select(shape(n=6000), db, tables)
    assert (near.source, near.config, near.row.gpu_name) == ("nearest", CFG_A, GPU)


def test_heuristic_is_the_space_default_for_every_arch_and_problem():
    for arch in space.ARCHES.values():
        for problem in (space.Problem(d, t, c) for d in space.HEAD_DIMS for t in space.DTYPES for c in (False, True)):
            s = space.Shape(2, 8, 1000, head_dim=problem.head_dim, dtype=problem.dtype, causal=problem.causal)
            sel = runtime.heuristic(s, GPU, arch)
            assert sel.source == "heuristic" and sel.config == space.default_config(problem, arch)
            assert space.is_valid(sel.config, problem, arch)


def test_user_storage_comes_from_the_environment_like_the_search(tmp_path, db, monkeypatch):
    store_rows(db, entry(shape(), CFG_C))
    monkeypatch.setenv(storage_url.ENV_VAR, db)
    sel = runtime.select_config(shape(), GPU, ARCH, tables_dir=None)
    assert (sel.source, sel.config) == ("storage", CFG_C)


def test_a_missing_sqlite_file_is_not_created(tmp_path):
    url = f"sqlite:///{tmp_path / 'nope' / 'absent.db'}"
    sel = select(shape(), url)
    assert sel.source == "heuristic"
    assert not (tmp_path / "nope").exists()


def test_an_unreadable_storage_warns_and_falls_through(tmp_path):
    bad = tmp_path / "garbage.db"
    bad.write_bytes(b"this is not an sqlite database" * 100)
    tables = shipped_dir(tmp_path, entry(shape(), CFG_B))
    with pytest.warns(runtime.StorageWarning, match="garbage.db"):
        sel = select(shape(), f"sqlite:///{bad}", tables)
    assert (sel.source, sel.config) == ("shipped", CFG_B)
    assert bad.read_bytes().startswith(b"this is not")  # nothing the user stored is touched


# ---- nearest neighbour ------------------------------------------------------------------------------------

def test_distance_metric_is_log2_seqlen_and_log2_batch_heads():
    assert runtime.distance(shape(n=1024), shape(n=2048)) == pytest.approx(1.0)
    assert runtime.distance(shape(batch=1, heads=16), shape(batch=4, heads=16)) == pytest.approx(2.0)
    assert runtime.distance(shape(batch=2, heads=8), shape(batch=1, heads=16)) == 0.0  # batch·heads is one axis
    assert runtime.distance(shape(n=1024), shape(n=2048, batch=16)) == pytest.approx(5 ** 0.5)
    # Nq and Nk each count half: a cross-attention shape differing only in seqlen_k is 1/sqrt(2) per octave
    assert runtime.distance(shape(n=1024, nk=1024), shape(n=1024, nk=2048)) == pytest.approx(0.5 ** 0.5)


def test_nearest_prefers_seqlen_and_batch_heads_closeness(db):
    store_rows(db, entry(shape(n=1024, batch=4), CFG_A), entry(shape(n=4096, batch=64), CFG_B),
               entry(shape(n=16384, batch=4), CFG_C))
    assert select(shape(n=3000, batch=4), db).config == CFG_A     # 1.55 octaves vs 2.45 (and 4 in B·H)
    assert select(shape(n=4096, batch=32), db).config == CFG_B    # 1 octave of B·H vs 2 octaves of seqlen
    assert select(shape(n=12000, batch=4), db).config == CFG_C


def test_nearest_ties_break_to_the_smaller_key(db):
    # 2048 lies one octave from both 1024 and 4096
    store_rows(db, entry(shape(n=4096), CFG_B), entry(shape(n=1024), CFG_A))
    sel = select(shape(n=2048), db)
    assert (sel.config, sel.row.seqlen, sel.distance) == (CFG_A, 1024, pytest.approx(1.0))


def test_nearest_ties_prefer_the_users_storage_over_shipped_tables(tmp_path, db):
    store_rows(db, entry(shape(n=4096), CFG_B))
    tables = shipped_dir(tmp_path, entry(shape(n=1024), CFG_A))  # the smaller key, but shipped
    assert select(shape(n=2048), db, tables).config == CFG_B
    assert select(shape(n=1500), db, tables).config == CFG_A  # no tie: 1024 is nearer


def test_nearest_ties_prefer_the_same_gqa_grouping(db):
    store_rows(db, entry(shape(n=1024, heads=32, kv_heads=32), CFG_A),
               entry(shape(n=1024, heads=32, kv_heads=8), CFG_B))
    assert select(shape(n=2048, heads=32, kv_heads=8), db).config == CFG_B
    assert select(shape(n=2048, heads=32, kv_heads=32), db).config == CFG_A


def test_exact_key_includes_kv_heads_and_seqlen_k(db):
    store_rows(db, entry(shape(heads=32, kv_heads=8), CFG_A), entry(shape(nk=8192), CFG_B))
    assert select(shape(heads=32, kv_heads=8), db).source == "storage"
    assert select(shape(heads=32, kv_heads=32), db).source == "nearest"
    assert select(shape(nk=8192), db).source == "storage"


# ---- rows that cannot run ---------------------------------------------------------------------------------

def test_an_invalid_exact_row_is_skipped_with_a_warning_never_chosen(tmp_path, db):
    s = shape()
    assert space.is_valid(BIG_SMEM, s.problem, ARCH) and not space.is_valid(BIG_SMEM, s.problem, SM86)
    store_rows(db, entry(s, BIG_SMEM, arch=SM86), entry(shape(n=2048), CFG_A, arch=SM86))
    with pytest.warns(runtime.InvalidRowWarning, match="smem_optin_limit"):
        sel = select(s, db, arch=SM86)
    assert (sel.source, sel.config) == ("nearest", CFG_A)
    assert any("smem_optin_limit" in n for n in sel.notes)
    assert "smem_optin_limit" in sel.explain()


def test_a_config_key_that_does_not_parse_is_skipped(tmp_path, db):
    tables = shipped_dir(tmp_path, entry(shape(), CFG_A))
    table = tables / "h200.json"
    doc = json.loads(table.read_text())
    doc["rows"][0]["config_key"] = doc["rows"][0]["config_key"].replace("br=64", "br=96")
    table.write_text(json.dumps(doc))
    with pytest.warns(runtime.InvalidRowWarning, match="not understood"):
        sel = select(shape(), db, tables)
    assert sel.source == "heuristic"


def test_a_row_whose_sizes_are_not_a_shape_is_skipped(tmp_path, db):
    tables = shipped_dir(tmp_path, entry(shape(n=1024), CFG_A), entry(shape(n=2048), CFG_B))
    table = tables / "h200.json"
    doc = json.loads(table.read_text())
    doc["rows"][1]["kv_heads"] = 3  # does not divide 16 heads
    table.write_text(json.dumps(doc))
    with pytest.warns(runtime.InvalidRowWarning, match="not a valid shape"):
        sel = select(shape(n=3000), db, tables)
    assert (sel.source, sel.config) == ("nearest", CFG_A)


def test_a_row_of_a_family_that_space_init_does_not_import_is_usable(db, monkeypatch):
    import importlib

    importlib.import_module("space.wgmma")  # only to find a valid config of that family
    config = next(c for c in space.enumerate_configs("wgmma") if space.is_valid(c, shape().problem, ARCH))
    store_rows(db, entry(shape(), config))
    # as in a fresh process where nothing imported space/wgmma.py (monkeypatch puts both back afterwards)
    monkeypatch.delitem(space.FAMILIES, "wgmma")
    monkeypatch.delitem(sys.modules, "space.wgmma")
    sel = select(shape(), db)
    assert (sel.source, sel.config) == ("storage", config) and "wgmma" in space.FAMILIES


def test_a_malformed_shipped_table_is_skipped_with_a_warning(tmp_path, db):
    tables = shipped_dir(tmp_path, entry(shape(), CFG_B))
    (tables / "broken.json").write_text("{not json")
    with pytest.warns(runtime.InvalidRowWarning, match="broken.json"):
        sel = select(shape(), db, tables)
    assert (sel.source, sel.config) == ("shipped", CFG_B)


def test_the_checked_in_fixture_table_reads_and_is_fake():
    rows = runtime.shipped_candidates(FIXTURE_TABLE.parent)
    assert rows and all(c.entry.gpu_name == GPU for c in rows)
    sel = runtime.select_config(rows[0].shape, GPU, rows[0].entry.arch, "sqlite://", tables_dir=FIXTURE_TABLE.parent)
    # the fixture predates the softmax_reduce axis: its key still parses, with the axis at its default
    assert sel.source == "shipped" and sel.config == space.Config.from_key(rows[0].entry.config_key)


def test_the_shipped_tables_live_in_studies_tuned_of_the_checkout():
    found = runtime.shipped_tables_dir()
    assert found == Path(runtime.__file__).resolve().parents[2] / "studies" / "tuned"
    assert (found / "README.md").is_file()


def test_the_tuned_readme_says_what_is_shipped():
    """studies/tuned/README.md once said nothing was shipped while the runtime used 15 shipped rows."""
    found = runtime.shipped_tables_dir()
    readme = (found / "README.md").read_text()
    tables = sorted(found.glob("*.json"))
    assert tables and "Nothing is shipped" not in readme
    for table in tables:
        rows = json.loads(table.read_text())["rows"]
        usable = [c for c in runtime.shipped_candidates(found) if c.where == str(table)]
        assert len(usable) == len(rows)  # every shipped row passes the checks the runtime makes
        gpus = sorted({r["gpu_name"] for r in rows})
        assert f"`{table.name}`: {len(rows)} rows for the {', '.join(f'`{g}`' for g in gpus)}" in readme


# ---- memo -------------------------------------------------------------------------------------------------

@pytest.fixture
def sql_statements():
    """Every SQL statement any engine executes while the fixture is active."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    seen: list[str] = []

    def record(conn, cursor, statement, *args):
        seen.append(statement)

    event.listen(Engine, "before_cursor_execute", record)
    yield seen
    event.remove(Engine, "before_cursor_execute", record)


def test_a_warm_selection_does_no_db_or_disk_work(tmp_path, db, sql_statements, monkeypatch):
    store_rows(db, entry(shape(n=1024), CFG_A))
    tables = shipped_dir(tmp_path, entry(shape(n=8192), CFG_B))
    sql_statements.clear()
    reads = []
    import autotune.store.best_table

    real_read = autotune.store.best_table.read_export
    monkeypatch.setattr(autotune.store.best_table, "read_export", lambda p: reads.append(p) or real_read(p))

    first = select(shape(n=1024), db, tables)
    assert sql_statements and reads  # the cold selection did read both
    sql_statements.clear(), reads.clear()
    assert select(shape(n=1024), db, tables) is first
    # another shape of the same problem: the rows are already in memory
    assert select(shape(n=8000), db, tables).config == CFG_B
    assert sql_statements == [] and reads == []

    runtime.clear_caches()  # and the counter does see a cold lookup again
    select(shape(n=1024), db, tables)
    assert sql_statements and reads


def test_the_default_storage_url_is_found_once_and_the_environment_still_counts(monkeypatch, db):
    calls = []
    real = storage_url.default_storage_url
    monkeypatch.setattr(storage_url, "default_storage_url", lambda: calls.append(1) or real())
    assert runtime.storage_key() == runtime.storage_key() == real()
    assert len(calls) == 1
    monkeypatch.setenv(storage_url.ENV_VAR, db)
    assert runtime.storage_key() == db
    assert runtime.storage_key("sqlite:///x.db") == "sqlite:///x.db"


def test_the_memo_is_keyed_by_storage_url(tmp_path):
    a, b = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    store_rows(a, entry(shape(), CFG_A))
    store_rows(b, entry(shape(), CFG_B))
    assert select(shape(), a).config == CFG_A
    assert select(shape(), b).config == CFG_B


# ---- build and resolve (no GPU: the device and the loader are stand-ins) ----------------------------------

def test_a_missing_binary_is_built_once_with_one_line_on_stderr(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path / "kernels"))
    problem = space.Problem(head_dim=64)
    config = space.default_config(problem, ARCH)
    first = runtime.build(config, problem, ARCH)
    err = capsys.readouterr().err
    assert first.ok and not first.cached, first.error
    assert err.count("\n") == 1 and "autotune: compiling" in err and config.key in err
    runtime.clear_caches()  # a new process would find it in the disk cache
    again = runtime.build(config, problem, ARCH)
    assert again.cached and again.cubin_path == first.cubin_path
    assert capsys.readouterr().err == ""


class _FakeBuild:
    def __init__(self, config, ok):
        self.config, self.ok, self.error = config, ok, None if ok else "ptxas: boom"


def test_resolve_falls_back_to_the_default_when_a_tuned_config_fails_to_build(db, monkeypatch):
    import autotune.launch.loader

    store_rows(db, entry(shape(), CFG_A))
    monkeypatch.setattr(runtime, "device_info", lambda device: (GPU, ARCH))
    built = []

    def fake_build(config, problem, arch, trusted_hash=None):
        built.append(config)
        return _FakeBuild(config, ok=config != CFG_A)

    class FakeRunner:
        def __init__(self, build):
            self.build = build

        def kernel(self, device):
            return ("kernel", device)

    monkeypatch.setattr(runtime, "build", fake_build)
    monkeypatch.setattr(autotune.launch.loader, "KernelRunner", FakeRunner)
    with pytest.warns(runtime.InvalidRowWarning, match="failed to build"):
        plan = runtime.resolve(0, shape(), db)
    assert built == [CFG_A, DEFAULT]
    assert plan.selection.source == "heuristic" and plan.runner.build.config == DEFAULT
    assert any("ptxas: boom" in n for n in plan.selection.notes)
    assert runtime.resolve(0, shape(), db) is plan and len(built) == 2  # memoized by (device, shape, storage)


# ---- the per-call memo of autotune.runtime.attention_op: tests/test_relaunch.py (a warm call's prepared launch) ----

# ---- input errors -----------------------------------------------------------------------------------------

def qkv(b=2, h=8, hkv=None, n=64, nk=None, d=64, dtype=torch.float16, device="cpu"):
    hkv, nk = hkv or h, nk or n
    return (torch.zeros(b, h, n, d, dtype=dtype, device=device), torch.zeros(b, hkv, nk, d, dtype=dtype, device=device),
            torch.zeros(b, hkv, nk, d, dtype=dtype, device=device))


def bad_inputs():
    q, k, v = qkv()
    yield "rank", (q[0], k, v), r"^q: expected a 4-d tensor"
    yield "unsupported dtype", (q.float(), k.float(), v.float()), r"^q: expected dtype torch.float16 or torch.bfloat16"
    yield "dtype mismatch", (q, k.bfloat16(), v), r"^k: expected the same dtype as q"
    yield "head dim", qkv(d=96), r"^q: expected head_dim in \(64, 128, 256\)"
    yield "kv heads", qkv(h=8, hkv=3), r"^k: expected a head count that divides q's 8 heads"
    yield "last dim", (q.transpose(2, 3).contiguous().transpose(2, 3), k, v), r"^q: expected a contiguous last dim"
    yield "empty", qkv(n=0), r"^q: expected a non-empty tensor"
    yield "k/v batch", (q, k, v[:1]), r"^v: expected the shape of k"
    yield "k/v seqlen", (q, k, v[:, :, :32]), r"^v: expected the shape of k"
    yield "k batch", (q, k[:1], v[:1]), r"^k: expected shape \(batch=2"
    yield "device", (q, k.to("meta"), v), r"^k: expected a tensor on q's device cpu, got a tensor on meta"
    yield "alignment", (torch.zeros(2 * 8 * 64 * 64 + 1, dtype=torch.float16)[1:].view(2, 8, 64, 64), k, v), \
        r"^q: expected a data pointer aligned to 16 bytes"
    yield "not a tensor", (q.numpy(), k, v), r"^q: expected a torch.Tensor"


@pytest.mark.parametrize("case", list(bad_inputs()), ids=lambda c: c[0])
def test_bad_inputs_raise_errors_naming_the_argument(case):
    _, (q, k, v), message = case
    with pytest.raises(ValueError, match=message):
        op.check_inputs(q, k, v, require_cuda=False)


def test_cpu_tensors_are_rejected_by_attention_itself():
    with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor, got a tensor on cpu"):
        autotune.attention(*qkv())
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"^v: expected a torch.Tensor, got ndarray"):
        autotune.attention(q, k, v.numpy())


def test_good_inputs_pass_including_strided_bnhd_and_gqa():
    b, n, h, d = 2, 17, 8, 128
    q = torch.zeros(b, n, h, d, dtype=torch.bfloat16).transpose(1, 2)  # (B,N,H,D) memory seen as (B,H,N,D)
    kv = torch.zeros(b, n, 2, d, dtype=torch.bfloat16).transpose(1, 2)
    got = op.check_inputs(q, kv, kv, require_cuda=False)
    assert (got.batch, got.heads, got.kv_heads, got.seqlen_q, got.head_dim, got.dtype) == (b, h, 2, n, d, "bf16")


@pytest.mark.parametrize("kwargs, error, message", [
    ({"causal": 1}, TypeError, r"^causal: expected one of \(False, True, 'upper_left', 'lower_right'\)"),
    ({"causal": "lower_left"}, TypeError, r"^causal: expected one of"),
    ({"return_lse": "yes"}, TypeError, r"^return_lse: expected True or False"),
    ({"scale": True}, TypeError, r"^scale: expected a float or None"),
    ({"scale": "0.1"}, TypeError, r"^scale: expected a float or None"),
    ({"scale": float("nan")}, ValueError, r"^scale: expected a finite float"),
])
def test_bad_flags_raise_errors_naming_the_argument(kwargs, error, message):
    with pytest.raises(error, match=message):
        autotune.attention(*qkv(device="meta"), **kwargs)


# ---- the custom op's fake implementation and torch.compile ------------------------------------------------

@pytest.mark.parametrize("return_lse", [False, True])
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_fake_implementation_shapes_and_dtypes(return_lse, layout):
    with FakeTensorMode():
        b, h, hkv, n, nk, d = 3, 8, 2, 1000, 17, 128
        if layout == "bhnd":
            q = torch.empty(b, h, n, d, dtype=torch.bfloat16, device="cuda")
            k = torch.empty(b, hkv, nk, d, dtype=torch.bfloat16, device="cuda")
        else:
            q = torch.empty(b, n, h, d, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
            k = torch.empty(b, nk, hkv, d, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
        out, lse = torch.ops.autotune.flash_attention_fwd(q, k, k, True, None, return_lse)
        assert out.shape == (b, h, n, d) and out.dtype == torch.bfloat16
        # laid out like q, as the real op returns it (torch.compile allocates from the fake)
        assert out.stride() == ((n * h * d, d, h * d, 1) if layout == "bnhd" else (h * n * d, n * d, d, 1))
        assert out.device == q.device
        assert lse.dtype == torch.float32 and lse.device == q.device
        assert lse.shape == ((b, h, n) if return_lse else (0,))
        # the public function takes the op path for fake tensors (it never touches their data)
        got = autotune.attention(q, k, k, causal=True, return_lse=return_lse)
        assert (got[0] if return_lse else got).shape == (b, h, n, d)


def test_fake_implementation_raises_the_same_errors():
    with FakeTensorMode():
        q, k, v = qkv(h=8, hkv=3, device="cuda")
        with pytest.raises(ValueError, match=r"^k: expected a head count that divides q's 8 heads"):
            autotune.attention(q, k, v)
        q, k, v = qkv(d=96, device="cuda")
        with pytest.raises(ValueError, match=r"^q: expected head_dim in"):
            autotune.attention(q, k, v)
        q, k, v = qkv(device="cpu")
        with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor"):
            torch.ops.autotune.flash_attention_fwd(q, k, v, False, None, False)


def test_fullgraph_compile_traces_one_op_call():
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(q, k, v):
        out, lse = autotune.attention(q, k, v, causal=True, scale=0.5, return_lse=True)
        return out * 2, lse

    with FakeTensorMode():
        q, k, v = qkv(h=8, hkv=2, n=100, device="cuda")
        out, lse = torch.compile(f, backend=capture, fullgraph=True)(q, k, v)
    assert out.shape == q.shape and lse.shape == q.shape[:3]
    calls = [n for n in graphs[0].graph.nodes if n.target is torch.ops.autotune.flash_attention_fwd.default]
    assert len(calls) == 1 and calls[0].args[3:] == (True, 0.5, True, "upper_left")


def test_eager_calls_skip_the_dispatcher_only_for_plain_tensors(monkeypatch):
    calls = []
    monkeypatch.setattr(op, "forward", lambda *a: calls.append(a) or (None, None))
    q, k, v = qkv()
    op.attention(q, k, v)
    assert len(calls) == 1  # direct
    assert not op._direct(q.requires_grad_(), k, v)  # autograd must see the op (it raises on backward)
    with torch.no_grad():
        assert op._direct(q, k, v)
    with torch.device("cpu"):  # a TorchFunctionMode is active
        assert not op._direct(q, k, v)


# ---- explain and the package surface ----------------------------------------------------------------------

def test_explain_names_source_provenance_and_distance(db):
    store_rows(db, entry(shape(n=1024, batch=2, heads=8), CFG_A, tflops=321.5))
    q, k, v = qkv(b=2, h=8, n=2048, d=128, device="meta")
    text = autotune.explain(q, k, v, storage=db, gpu_name=GPU, arch="sm_90")
    assert CFG_A.key in text and "nearest" in text and "distance 1.000" in text
    assert "321.5 TFLOPS" in text and "'fixture'" in text and "trial 7" in text
    # sm_100: no table shipped for that arch, so not even another GPU's row stands in
    text = autotune.explain(q, k, v, causal=True, storage=db, gpu_name=GPU, arch="sm_100")
    sm100 = space.get_arch("sm_100")
    assert "heuristic" in text and space.default_config(space.Problem(128, causal=True), sm100).key in text
    with pytest.raises(ValueError, match="^q: expected a CUDA tensor"):
        autotune.explain(*qkv())


def test_import_autotune_does_not_import_torch():
    import subprocess

    code = "import sys, autotune, autotune.cli; assert 'torch' not in sys.modules; print(autotune.__all__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "attention" in done.stdout


# ---- one bad row costs that row ----------------------------------------------------------------------------

def test_a_shipped_row_whose_config_contradicts_its_key_is_skipped_and_the_file_kept(tmp_path, db):
    tables = shipped_dir(tmp_path, entry(shape(n=1024), CFG_A), entry(shape(n=4096), CFG_C))
    table = tables / "h200.json"
    doc = json.loads(table.read_text())
    assert doc["rows"][1]["seqlen"] == 4096
    doc["rows"][1]["config"] = CFG_B.as_dict()  # the key says CFG_C, the dict CFG_B: which would run?
    doc["rows"][0]["tflops"] = 2.0
    table.write_text(json.dumps(doc))
    with pytest.warns(runtime.InvalidRowWarning, match=r"rows\[1\]: config contradicts config_key"):
        sel = select(shape(n=4096), db, tables)
    assert (sel.source, sel.config, sel.row.seqlen) == ("nearest", CFG_A, 1024)  # rows[0] of the file still serves
    assert any("rows[1]" in n for n in sel.notes)


def test_a_malformed_stored_row_costs_that_row_not_the_storage(tmp_path, db):
    import sqlite3

    store_rows(db, entry(shape(n=1024), CFG_A), entry(shape(n=4096), CFG_C))
    with sqlite3.connect(storage_url.sqlite_path(db)) as con:
        con.execute("update autotune_best set tflops=-5 where seqlen=4096")
    with pytest.warns(runtime.InvalidRowWarning, match="tflops"):
        sel = select(shape(n=4096), db)
    assert (sel.source, sel.config, sel.row.seqlen) == ("nearest", CFG_A, 1024)


# ---- the causal mask's alignment in the lookup ----------------------------------------------------------------

CAUSAL = space.Problem(head_dim=128, dtype="fp16", causal=True)
CAUSAL_MMA = space.default_config(CAUSAL, ARCH, "mma_sync")
CAUSAL_A = CAUSAL_MMA.replace(br=64, bc=64, warps_m=4)
CAUSAL_B = CAUSAL_MMA.replace(br=128, bc=32, warps_m=8)


def causal(n, nk=None, align="upper_left", **kw) -> space.Shape:
    return dataclasses.replace(shape(n, nk=nk, **kw), causal=True, causal_align=align)


def test_a_lower_right_call_never_gets_an_upper_left_row_of_nq_not_nk(db):
    store_rows(db, entry(causal(4, 4096), CAUSAL_A))          # timed top-left: almost every key masked
    lr = select(causal(4, 4096, "lower_right"), db)
    assert lr.source == "heuristic"                              # neither the exact row nor a neighbour
    assert select(causal(4, 4096), db).config == CAUSAL_A
    store_rows(db, entry(causal(8, 4096, "lower_right"), CAUSAL_B))
    op.clear_caches()  # (a search in another process: the rows are read again)
    near = select(causal(4, 4096, "lower_right"), db)            # the lower-right neighbour, not the nearer row
    assert (near.source, near.config, near.row.causal_align) == ("nearest", CAUSAL_B, "lower_right")
    assert select(causal(4, 4096), db).config == CAUSAL_A        # and an upper-left call keeps its own
    exact = select(causal(8, 4096, "lower_right"), db)
    assert (exact.source, exact.config) == ("storage", CAUSAL_B)


def test_for_nq_equal_nk_both_alignments_are_one_key(tmp_path, db):
    tables = shipped_dir(tmp_path, entry(causal(2048), CAUSAL_A))
    for align in ("upper_left", "lower_right"):
        chosen = select(causal(2048, align=align), db, tables)
        assert (chosen.source, chosen.config) == ("shipped", CAUSAL_A), align
    # a square row stands in for a lower-right prefill chunk (Nq 1024 of Nk 2048) as a neighbour
    near = select(causal(1024, 2048, "lower_right"), db, tables)
    assert (near.source, near.config) == ("nearest", CAUSAL_A)


def test_attention_looks_up_the_calls_alignment(monkeypatch):
    resolved = []

    class Launch:
        extra_args, params, combine = (), FlashFwdParams(), None

    class Runner:
        def prepare(self, q, k, v, o, lse=None, scale=None, causal_align="upper_left"):
            self.align = causal_align
            return Launch()

    def fake_resolve(device, s, url):
        resolved.append(s)
        return runtime.Plan(None, Runner(), None)

    check = op.check_inputs
    monkeypatch.setattr(op, "check_inputs", lambda q, k, v, require_cuda=True: check(q, k, v, require_cuda=False))
    monkeypatch.setattr(runtime, "resolve", fake_resolve)
    monkeypatch.setattr(op, "Relaunch", lambda launch: launch)  # only the lookup is asked about here
    q, k, v = qkv(h=8, hkv=2, n=4, nk=64)
    for causal_arg in ("lower_right", True, False):
        op._new_launcher(q, k, v, causal_arg, None, False, "sqlite:///x.db")
    assert [(s.causal, s.causal_align, s.seqlen_k) for s in resolved] == [
        (True, "lower_right", 64), (True, "upper_left", 64), (False, "upper_left", 64)]
    text = autotune.explain(q.to("meta"), k.to("meta"), v.to("meta"), causal="lower_right", storage="sqlite:///x.db",
                            gpu_name=GPU, arch="sm_90")
    assert "-causal-lower-right on" in text.splitlines()[0]
