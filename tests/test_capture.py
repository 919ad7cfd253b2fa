"""Capture → campaign on CPU: the buckets, the file (a campaign `autotune campaign` loads as it is), counts,
several writers on one file (no repeated shape), a killed process (no lost shape), the hook in attention and the
lookup finding a bucket's row."""
from __future__ import annotations

import dataclasses
import fcntl
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import space
from autotune.runtime import buckets, capture as cap
from autotune.runtime import lookup as runtime
from autotune.search import campaign
from autotune.store import storage_url
from autotune.store.best_table import BestEntry, BestStore

torch = pytest.importorskip("torch")

from autotune.runtime import attention_op as op  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def no_capture(monkeypatch):
    monkeypatch.delenv(cap.ENV_VAR, raising=False)
    monkeypatch.delenv(storage_url.ENV_VAR, raising=False)
    cap.stop()
    op.clear_caches()
    yield
    cap.stop()
    op.clear_caches()


def qk(b=4, h=32, hkv=8, n=1000, nk=None, d=128, dtype=torch.bfloat16):
    return torch.empty(b, h, n, d, dtype=dtype), torch.empty(b, hkv, nk or n, d, dtype=dtype)


@pytest.mark.parametrize("n,expected", [(1, 1), (7, 7), (16, 16), (17, 20), (20, 20), (21, 24), (64, 64), (65, 80),
                                        (577, 640), (1000, 1024), (1024, 1024), (1025, 1280), (4097, 5120)])
def test_sizes_round_up_to_four_buckets_per_octave_and_stay_exact_up_to_16(n, expected):
    assert buckets.bucket_size(n) == expected


def test_buckets_are_few_close_and_stable():
    sizes = range(1, 32769)
    assert len({buckets.bucket_size(n) for n in sizes}) == 60
    for n in sizes:
        b = buckets.bucket_size(n)
        assert n <= b <= n * 1.25 and buckets.bucket_size(b) == b
    shape = space.Shape(batch=3, heads=32, kv_heads=8, seqlen_q=1, seqlen_k=4097, head_dim=128, dtype="bf16")
    assert buckets.bucket(shape) == space.Shape(batch=3, heads=32, kv_heads=8, seqlen_q=1, seqlen_k=5120,
                                                head_dim=128, dtype="bf16")


def test_the_capture_file_is_a_campaign_of_the_buckets_with_their_counts(tmp_path):
    path = tmp_path / "shapes.toml"
    with cap.capture(path) as c:
        for n in (1000, 1001, 1020, 1000):  # one bucket: its first size exact, the bucket from the second size on
            cap.record(*qk(n=n), causal=True)
        for nk in range(4090, 4100):  # a decode loop: two buckets, as buckets from the first step
            cap.record(*qk(n=1, nk=nk), causal=False)
        assert sum(c.shapes.values()) == 14
    entries = campaign.load(path)
    prefill = space.Shape(batch=4, heads=32, kv_heads=8, seqlen_q=1000, head_dim=128, dtype="bf16", causal=True)
    expected = [prefill, dataclasses.replace(prefill, seqlen_q=1024, seqlen_k=1024),
                space.Shape(batch=4, heads=32, kv_heads=8, seqlen_q=1, seqlen_k=4096, head_dim=128, dtype="bf16"),
                space.Shape(batch=4, heads=32, kv_heads=8, seqlen_q=1, seqlen_k=5120, head_dim=128, dtype="bf16")]
    assert [e.shape for e in entries] == expected
    assert cap.read(path) == list(zip(expected, [2, 2, 7, 3]))  # N1000's calls stay its own


def test_a_model_of_one_size_is_captured_as_that_size_and_its_row_serves_it(tmp_path):
    """A ViT calls one shape: the campaign tunes that shape rather than its bucket (whose winner measured 2 %
    slower in the model on the H200), and the runtime serves its exact row."""
    path = tmp_path / "vit.toml"
    for _ in range(2):  # a second run finds its size in the file: still exact, counts added
        with cap.capture(path):
            for _ in range(48):  # 24 layers, two batches
                cap.record(*qk(b=64, h=16, hkv=16, n=577, d=64), causal=False)
    vit = space.Shape(batch=64, heads=16, seqlen_q=577, head_dim=64, dtype="bf16")
    assert cap.read(path) == [(vit, 96)]
    url = f"sqlite:///{tmp_path / 'user.db'}"
    arch = space.get_arch("sm_90")
    config = space.default_config(space.Problem(64, "bf16", False), arch, "mma_sync").replace(br=64, bc=64,
                                                                                              warps_m=4)
    with BestStore(url) as store:
        store.record_best(BestEntry.for_shape(vit, "FAKE GPU", "sm_90", config, 300.0, study="campaign", trial=1))
    chosen = runtime.select_config(vit, "FAKE GPU", arch, url, tables_dir=None)
    assert (chosen.source, chosen.config, chosen.distance) == ("storage", config, 0.0)


def test_a_second_size_in_another_process_brings_the_bucket(tmp_path):
    """Which size came first is read from the file: a writer whose first size differs from the file's counts its
    calls under the bucket, as one process seeing both would."""
    path = tmp_path / "shapes.toml"
    first, second = cap.CaptureFile(path), cap.CaptureFile(path)
    first.record(*qk(n=577), causal=False)
    second.record(*qk(n=600), causal=False)
    second.record(*qk(n=577), causal=False)  # a bucket already counting in this process: the bucket
    first.record(*qk(n=577), causal=False)
    first.close(), second.close()
    assert [(s.seqlen_q, n) for s, n in cap.read(path)] == [(577, 2), (640, 2)]


def test_a_lower_right_call_is_captured_as_a_lower_right_campaign_shape(tmp_path):
    path = tmp_path / "shapes.toml"
    with cap.capture(path):
        cap.record(*qk(n=4, nk=4000), causal="lower_right")   # speculative decoding: 4 new tokens
        cap.record(*qk(n=4, nk=4000), causal=True)            # the same sizes top-left: another shape
    assert 'causal = "lower_right"' in path.read_text()
    lr = space.Shape(batch=4, heads=32, kv_heads=8, seqlen_q=4, seqlen_k=4096, head_dim=128, dtype="bf16",
                     causal=True, causal_align="lower_right")
    assert [e.shape for e in campaign.load(path)] == [lr, dataclasses.replace(lr, causal_align="upper_left")]
    assert [n for _, n in cap.read(path)] == [1, 1]


def test_counts_are_written_at_powers_of_two_and_exactly_at_the_end(tmp_path):
    path = tmp_path / "shapes.toml"
    with cap.capture(path):
        for _ in range(11):
            cap.record(*qk(), causal=False)
        lines = [l for l in path.read_text().splitlines() if l.startswith("# calls")]
        assert [int(l.split()[2]) for l in lines] == [1, 2, 4, 8]  # a killed run would still say 8
    assert cap.read(path)[0][1] == 11


def test_a_second_run_adds_no_repeated_shape_and_its_counts_add_up(tmp_path):
    path = tmp_path / "shapes.toml"
    for _ in range(2):
        with cap.capture(path):
            cap.record(*qk(), causal=False)
            cap.record(*qk(n=300), causal=False)
    assert len(campaign.load(path)) == 2
    assert [n for _, n in cap.read(path)] == [2, 2]


def test_a_writer_that_opened_the_file_before_another_appended_rereads_it(tmp_path):
    path = tmp_path / "shapes.toml"
    first, second = cap.CaptureFile(path), cap.CaptureFile(path)  # both have read the (empty) file
    first.record(*qk(), causal=False)
    second.record(*qk(), causal=False)  # the same bucket: must see first's table under the lock
    first.close(), second.close()
    assert len(campaign.load(path)) == 1


def test_the_file_lock_is_held_from_the_reread_to_the_append(tmp_path):
    path = tmp_path / "shapes.toml"
    c = cap.CaptureFile(path)
    held = []
    append = c._append

    def probe_then_append(text):
        if text.startswith("[[shapes]]"):
            with open(path, "rb") as other:  # another open file description, as another process would have
                try:
                    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held.append(False)
                    fcntl.flock(other, fcntl.LOCK_UN)
                except BlockingIOError:
                    held.append(True)
        append(text)

    c._append = probe_then_append
    c.record(*qk(), causal=False)
    c.record(*qk(n=300), causal=False)
    c.close()
    assert held == [True, True]


def test_a_killed_process_loses_no_shape(tmp_path):
    path = tmp_path / "shapes.toml"
    script = textwrap.dedent(f"""
        import os, signal, torch
        from autotune.runtime import capture
        assert capture.recording  # from {cap.ENV_VAR}
        for n in (100, 300, 1000, 3000):
            capture.record(torch.empty(2, 8, n, 64, dtype=torch.float16), torch.empty(2, 8, n, 64, dtype=torch.float16), True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    env = {**os.environ, cap.ENV_VAR: str(path), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert [e.shape.seqlen_q for e in campaign.load(path)] == [100, 300, 1000, 3000]  # each its bucket's first size
    assert [n for _, n in cap.read(path)] == [1, 1, 1, 1]


def test_capture_files_that_cannot_be_used_are_one_line_naming_the_file(tmp_path):
    with pytest.raises(cap.CaptureError, match="shapes.json: a capture file is TOML"):
        cap.CaptureFile(tmp_path / "shapes.json")
    with pytest.raises(cap.CaptureError, match="directory .*nowhere does not exist"):
        cap.CaptureFile(tmp_path / "nowhere" / "shapes.toml")
    (tmp_path / "bad.toml").write_text("this is = = not toml\n")
    with pytest.raises(cap.CaptureError, match="bad.toml: not a TOML campaign file"):
        cap.CaptureFile(tmp_path / "bad.toml")


def test_a_bad_environment_path_warns_once_and_does_not_capture(tmp_path, monkeypatch):
    monkeypatch.setenv(cap.ENV_VAR, str(tmp_path / "shapes.json"))
    monkeypatch.setattr(cap, "recording", True)
    with pytest.warns(RuntimeWarning, match="AUTOTUNE_CAPTURE.*not capturing"):
        cap.record(*qk(), causal=False)
    assert cap.recording is False


def test_a_capture_block_suspends_the_outer_capture(tmp_path):
    outer = cap.start(tmp_path / "outer.toml")
    with cap.capture(tmp_path / "inner.toml"):
        cap.record(*qk(), causal=False)
    cap.record(*qk(n=300), causal=False)
    cap.stop()
    assert [s.seqlen_q for s, _ in cap.read(outer.path)] == [300]
    assert [s.seqlen_q for s, _ in cap.read(tmp_path / "inner.toml")] == [1000]
    assert cap.recording is False


def test_attention_counts_each_call_it_runs(tmp_path, monkeypatch):
    runs = []
    monkeypatch.setattr(op, "_new_launcher", lambda q, k, v, *a: lambda q, k, v: runs.append(1) or (q, None))
    q, k = qk(b=2, h=8, hkv=8, n=200, d=64, dtype=torch.float16)
    with cap.capture(tmp_path / "shapes.toml"):
        for _ in range(3):
            op.forward(q, k, k, True, None, False)
    assert len(runs) == 3
    assert cap.read(tmp_path / "shapes.toml") == [
        (space.Shape(batch=2, heads=8, seqlen_q=200, head_dim=64, dtype="fp16", causal=True), 3)]


def test_the_lookup_finds_the_row_of_a_shapes_bucket(tmp_path):
    url = f"sqlite:///{tmp_path / 'user.db'}"
    arch = space.get_arch("sm_90")
    problem = space.Problem(head_dim=64, dtype="bf16", causal=False)
    config = space.default_config(problem, arch, "mma_sync").replace(br=64, bc=64, warps_m=4)
    vit = space.Shape(batch=64, heads=16, seqlen_q=577, head_dim=64, dtype="bf16")
    with BestStore(url) as store:
        store.record_best(BestEntry.for_shape(buckets.bucket(vit), "FAKE GPU", "sm_90", config, 290.0,
                                              study="campaign", trial=3))
    chosen = runtime.select_config(vit, "FAKE GPU", arch, url, tables_dir=None)
    assert (chosen.source, chosen.config, chosen.distance) == ("storage", config, 0.0)
    assert "tuned as the bucket b64-h16-n640-d64-bf16-full" in chosen.explain()
