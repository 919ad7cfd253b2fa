"""One-shot GPU probe of the wgmma family: compile a ladder of configs, check them, time the correct ones.

    python benchmarks/wgmma_probe.py            # from the repo root, PYTHONPATH=$PWD; full log in $OUT/wgmma_probe.log

Self-contained on purpose (its own tiny cubin loader and parameter block), so it runs before the build/measure
layers are finished. Steps:
  1. compile every (config, problem) in parallel with nvcc (-Xptxas -v parsed: registers, spills);
  2. a worker subprocess loads each cubin with cuda-python and runs the correctness matrix against an fp32
     torch reference: output and K/V/Q padding poisoned with NaN, seqlens 1/17/128/1000/4096, cross lengths,
     causal, fp16/bf16, d64/d128, GQA 4:1, (B,N,H,D) strides, logsumexp checked too. Configs run from safest to
     riskiest; a fault or hang kills only the worker, which restarts at the next config;
  3. correct configs are timed (CUDA events, L2 flushed, median of 30 after warm-up) at B·N = 16384,
     H = 2048 / D, N = 4096, next to SDPA's flash and cuDNN backends, in TFLOPS.
stdout is compact (one line per config × problem, failures, the final table); every case is in the log.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import ctypes
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import space  # noqa: E402
import space.wgmma  # noqa: E402,F401  (registers the family even before space/__init__ imports it)
from space import Config, Problem  # noqa: E402

ARCH = space.get_arch("sm_90")
DEADLINE_S = 270          # stop starting new work after this (the run gets about 5 minutes)
CONFIG_TIMEOUT_S = 20     # a worker silent this long is hung (a case takes well under 1 s): kill it, move on
TIMING = [  # (label, head_dim, dtype, causal, batch, heads, seqlen)
    ("d128 fp16", 128, "fp16", False, 4, 16, 4096),
    ("d128 fp16 causal", 128, "fp16", True, 4, 16, 4096),
    ("d64 fp16", 64, "fp16", False, 4, 32, 4096),
    ("d128 bf16", 128, "bf16", False, 4, 16, 4096),
]

# The ladder, safest first: plain producer/consumer, then one feature at a time, then the combinations FA3 uses.
LADDER = [
    dict(consumer_wgs=1, bc=64, stages=2, setmaxnreg=False, overlap=False, pingpong=False, o_store="direct", min_blocks=1),
    dict(consumer_wgs=2, bc=64, stages=2, setmaxnreg=False, overlap=False, pingpong=False, o_store="direct", min_blocks=1),
    dict(consumer_wgs=2, bc=128, stages=2, setmaxnreg=False, overlap=False, pingpong=False, o_store="direct", min_blocks=1),
    dict(consumer_wgs=2, bc=128, stages=2, setmaxnreg=True, overlap=False, pingpong=False, o_store="direct", min_blocks=1),
    dict(consumer_wgs=2, bc=96, stages=3, setmaxnreg=True, overlap=False, pingpong=False, o_store="smem", min_blocks=1),
    dict(consumer_wgs=1, bc=64, stages=3, setmaxnreg=False, overlap=True, pingpong=False, o_store="direct", min_blocks=2),
    dict(consumer_wgs=1, bc=112, stages=2, setmaxnreg=False, overlap=False, pingpong=False, o_store="smem", min_blocks=2),
    dict(consumer_wgs=2, bc=128, stages=2, setmaxnreg=True, overlap=True, pingpong=False, o_store="direct", min_blocks=1),
    dict(consumer_wgs=2, bc=128, stages=2, setmaxnreg=True, overlap=True, pingpong=True, o_store="direct", min_blocks=1),
    dict(consumer_wgs=2, bc=176, stages=2, setmaxnreg=True, overlap=True, pingpong=True, o_store="direct", min_blocks=1),
    dict(consumer_wgs=2, bc=176, stages=2, setmaxnreg=True, overlap=True, pingpong=True, o_store="smem", min_blocks=1),
    dict(consumer_wgs=2, bc=112, stages=3, setmaxnreg=True, overlap=True, pingpong=True, o_store="direct", min_blocks=1),
    dict(consumer_wgs=2, bc=80, stages=4, setmaxnreg=True, overlap=True, pingpong=True, o_store="direct", min_blocks=1),
    dict(consumer_wgs=3, bc=128, stages=2, setmaxnreg=True, overlap=True, pingpong=False, o_store="direct", min_blocks=1),
    dict(consumer_wgs=3, bc=80, stages=2, setmaxnreg=True, overlap=True, pingpong=False, o_store="smem", min_blocks=1),
    dict(consumer_wgs=3, bc=64, stages=3, setmaxnreg=True, overlap=False, pingpong=False, o_store="direct", min_blocks=1),
]
PROBLEMS = [Problem(d, dt, c) for d in (128, 64) for dt in ("fp16", "bf16") for c in (False, True)]
# (batch, heads, kv_heads, seqlen_q, seqlen_k, layout): bhnd = (B,H,N,D) memory, bnhd = (B,N,H,D) memory
CASES = [
    (1, 2, 2, 1, 1, "bhnd"),
    (2, 2, 2, 17, 17, "bhnd"),
    (1, 2, 2, 128, 128, "bhnd"),
    (2, 4, 1, 1000, 1000, "bnhd"),
    (1, 2, 2, 4096, 4096, "bhnd"),
    (1, 4, 1, 128, 1000, "bhnd"),
    (1, 2, 2, 1000, 17, "bnhd"),
]


# ---------------------------------------------------------------------------------------------------------------
# output


class Out:
    def __init__(self, log_path: Path):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(log_path, "w", buffering=1)

    def say(self, line: str = "") -> None:  # stdout and log
        print(line, flush=True)
        self.log.write(line + "\n")

    def note(self, line: str) -> None:  # log only
        self.log.write(line + "\n")


# ---------------------------------------------------------------------------------------------------------------
# compile


def nvcc_path() -> str:
    for cand in (shutil.which("nvcc"), os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")):
        if cand and os.path.exists(cand):
            return cand
    raise SystemExit("nvcc not found (PATH or $CUDA_HOME/bin)")


def compile_one(nvcc: str, cfg: Config, prob: Problem, out_dir: Path) -> dict:
    defs = space.defines(cfg, prob)
    cubin = out_dir / (hashlib.sha1(f"{cfg.key}|{prob.key}".encode()).hexdigest()[:16] + ".cubin")
    cmd = [nvcc, "-cubin", "-o", str(cubin), f"-gencode={ARCH.gencode}", "-O3", "-std=c++17", "-Xptxas", "-v",
           *[f"-D{k}={v}" for k, v in defs.items()], str(ROOT / "kernels" / space.get_family("wgmma").source)]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    text = r.stdout + r.stderr
    info = {"cfg": cfg.key, "prob": prob.key, "ok": r.returncode == 0, "seconds": round(time.time() - t0, 1),
            "cubin": str(cubin) if r.returncode == 0 else None}
    m = re.search(r"Used (\d+) registers", text)
    info["regs"] = int(m.group(1)) if m else None
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    info["spill"] = (int(m.group(1)), int(m.group(2))) if m else None
    info["warnings"] = [ln.strip() for ln in text.splitlines() if "warning" in ln.lower()][:5]
    if r.returncode:
        info["error"] = text[-2000:]
    return info


# ---------------------------------------------------------------------------------------------------------------
# worker side: loader, launch, checks, timing


class Params(ctypes.Structure):
    """Mirror of kernels/common/flash_params.h (160 bytes)."""

    _fields_ = [("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("o", ctypes.c_void_p),
                ("lse", ctypes.c_void_p)] + [
        (f"{t}_{s}_stride", ctypes.c_longlong) for t in "qkvo" for s in ("batch", "head", "row")] + [
        ("batch", ctypes.c_int), ("heads", ctypes.c_int), ("kv_heads", ctypes.c_int), ("seqlen_q", ctypes.c_int),
        ("seqlen_k", ctypes.c_int), ("scale_log2", ctypes.c_float)]


assert ctypes.sizeof(Params) == 160


class CudaCallError(RuntimeError):
    pass


def drv():
    try:
        from cuda.bindings import driver as d
    except ImportError:
        from cuda import cuda as d
    return d


def ck(result, what: str):
    err, *vals = result
    if err != drv().CUresult.CUDA_SUCCESS:
        raise CudaCallError(f"{what}: {err}")
    return vals[0] if len(vals) == 1 else (tuple(vals) or None)


class Kernel:
    def __init__(self, cubin_path: str, entry: str, smem: int):
        import torch

        torch.cuda.init()
        torch.zeros(1, device="cuda")  # makes torch's primary context current on this thread
        d = drv()
        data = Path(cubin_path).read_bytes()
        self._image = ctypes.create_string_buffer(data, len(data))
        self.module = ck(d.cuModuleLoadData(ctypes.addressof(self._image)), "cuModuleLoadData")
        self.fn = ck(d.cuModuleGetFunction(self.module, entry.encode()), "cuModuleGetFunction")
        ck(d.cuFuncSetAttribute(self.fn, d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                smem), "cuFuncSetAttribute(max dynamic smem)")
        self.smem = smem

    def launch(self, grid, threads, params, tmaps) -> None:
        import torch

        d = drv()
        args = [ctypes.addressof(params)] + [int(t.getPtr()) for t in tmaps]
        ptrs = (ctypes.c_void_p * len(args))(*args)
        stream = d.CUstream(torch.cuda.current_stream().cuda_stream)
        ck(d.cuLaunchKernel(self.fn, *grid, threads, 1, 1, self.smem, stream, ctypes.addressof(ptrs), 0),
           "cuLaunchKernel")


def strides3(t):
    return tuple(t.stride(i) if t.shape[i] > 1 else 0 for i in range(3))


def make_params(q, k, v, o, lse, scale):
    p = Params()
    p.q, p.k, p.v, p.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
    p.lse = lse.data_ptr() if lse is not None else None
    for name, t in zip("qkvo", (q, k, v, o)):
        for s, val in zip(("batch", "head", "row"), strides3(t)):
            setattr(p, f"{name}_{s}_stride", val)
    p.batch, p.heads, p.kv_heads = q.shape[0], q.shape[1], k.shape[1]
    p.seqlen_q, p.seqlen_k = q.shape[2], k.shape[2]
    p.scale_log2 = scale * math.log2(math.e)
    return p


def prepare(kern, cfg: Config, q, k, v, o, lse):
    """Everything host-side done once (params, tensor maps, grid); returns the launch as a closure, which also
    keeps the ctypes/tensor-map objects alive as long as it lives."""
    from autotune.launch import tma

    lay = space.layout(cfg, Problem(q.shape[3], "bf16" if str(q.dtype) == "torch.bfloat16" else "fp16"))
    params = make_params(q, k, v, o, lse, 1.0 / math.sqrt(q.shape[3]))
    tmaps = tma.flash_tensor_maps(q, k, v, cfg.bc)
    # space.Layout.grid: the one grid formula (a persistent config needs SMs × resident CTAs, which this
    # self-contained loader does not query: it raises for those; autotune.launch.loader's runner launches them).
    grid = lay.grid(q.shape[0], q.shape[1], q.shape[2])
    return lambda: kern.launch(grid, lay.threads, params, tmaps)


def padded(shape_bhnd, layout: str, pad_rows: int, dtype, fill_nan: bool):
    """A (B,H,N,D) view into a NaN-poisoned buffer with `pad_rows` extra sequence rows (and the given memory order),
    so reading past seqlen, writing past seqlen_q, or stepping into a neighbour head shows up as NaN."""
    import torch

    b, h, n, d = shape_bhnd
    if layout == "bhnd":
        buf = torch.full((b, h, n + pad_rows, d), float("nan"), dtype=dtype, device="cuda")
        view = buf[:, :, :n]
    else:
        buf = torch.full((b, n + pad_rows, h, d), float("nan"), dtype=dtype, device="cuda")
        view = buf[:, :n].transpose(1, 2)
    if not fill_nan:
        view.copy_(torch.randn(b, h, n, d, device="cuda", dtype=torch.float32).to(dtype))
    return buf, view


def reference(q, k, v, causal: bool):
    import torch

    qf, kf, vf = q.float(), k.float(), v.float()
    rep = q.shape[1] // k.shape[1]
    kf, vf = kf.repeat_interleave(rep, 1), vf.repeat_interleave(rep, 1)
    s = (qf @ kf.transpose(-1, -2)) / math.sqrt(q.shape[3])
    if causal:  # top-left aligned, as scaled_dot_product_attention(is_causal=True)
        nq, nk = q.shape[2], k.shape[2]
        s = s.masked_fill(torch.ones(nq, nk, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.softmax(s, -1) @ vf, lse


def sdpa_error(q, k, v, causal, ref):
    import torch.nn.functional as F

    kw = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
    try:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, **kw)
    except Exception:  # noqa: BLE001  (older torch without enable_gqa)
        rep = q.shape[1] // k.shape[1]
        out = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                             is_causal=causal)
    return (out.float() - ref).abs().max().item()


def check_case(kern, cfg: Config, prob: Problem, case) -> dict:
    import torch

    b, h, hkv, nq, nk, layout = case
    dtype = torch.float16 if prob.dtype == "fp16" else torch.bfloat16
    d = prob.head_dim
    torch.manual_seed(1234 + nq * 7 + nk)
    _, q = padded((b, h, nq, d), layout, 64, dtype, False)
    _, k = padded((b, hkv, nk, d), layout, 64, dtype, False)
    _, v = padded((b, hkv, nk, d), layout, 64, dtype, False)
    obuf, o = padded((b, h, nq, d), layout, 64, dtype, True)
    lse = torch.full((b, h, nq), float("nan"), device="cuda", dtype=torch.float32)
    prepare(kern, cfg, q, k, v, o, lse)()
    torch.cuda.synchronize()
    ref, ref_lse = reference(q, k, v, prob.causal)
    out = o.float()
    nan_out = int(torch.isnan(out).sum().item())
    err = (out - ref).abs().nan_to_num(float("inf")).max().item()
    lse_err = (lse - ref_lse).abs().nan_to_num(float("inf")).max().item()
    if layout == "bhnd":
        pad_written = int((~torch.isnan(obuf[:, :, nq:])).sum().item())
    else:
        pad_written = int((~torch.isnan(obuf[:, nq:])).sum().item())
    sdpa = sdpa_error(q, k, v, prob.causal, ref)
    floor = 2e-3 if prob.dtype == "fp16" else 1.6e-2
    ok = nan_out == 0 and pad_written == 0 and err <= max(2 * sdpa, floor) and lse_err <= 2e-3
    return {"case": f"b{b}h{h}kv{hkv}q{nq}k{nk}-{layout}", "ok": ok, "err": err, "sdpa": sdpa,
            "lse_err": lse_err, "nan": nan_out, "pad_written": pad_written}


def time_fn(fn, iters=30, warmup=5) -> float:
    import torch

    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2] / 1e3


def tflops(b, h, n, d, causal, seconds) -> float:
    f = 4.0 * b * h * n * n * d
    return (f / 2 if causal else f) / seconds / 1e12


def timing_inputs(d, dtype_name, b, h, n):
    import torch

    dtype = torch.float16 if dtype_name == "fp16" else torch.bfloat16
    torch.manual_seed(0)
    return [torch.randn(b, h, n, d, device="cuda", dtype=dtype) for _ in range(3)]


def worker(jobs_path: str, start: int) -> int:
    import torch

    jobs = json.loads(Path(jobs_path).read_text())
    for ci in range(start, len(jobs["configs"])):
        entry = jobs["configs"][ci]
        cfg = Config.from_key(entry["cfg"])
        print(json.dumps({"begin": ci}), flush=True)
        all_ok = True
        for prob_key, cubin in entry["cubins"].items():
            prob = next(p for p in PROBLEMS if p.key == prob_key)
            try:
                kern = Kernel(cubin, "flash_fwd_wgmma", space.layout(cfg, prob).smem_dynamic)
                for case in CASES:
                    res = check_case(kern, cfg, prob, case)
                    all_ok &= res["ok"]
                    print(json.dumps({"ci": ci, "prob": prob_key, **res}), flush=True)
            except Exception as e:  # noqa: BLE001  (a fault poisons the context: report and let the parent restart)
                print(json.dumps({"ci": ci, "prob": prob_key, "fatal": f"{type(e).__name__}: {e}"[:400]}), flush=True)
                return 3
        if all_ok:
            for label, d, dt, causal, b, h, n in TIMING:
                prob = Problem(d, dt, causal)
                cubin = entry["cubins"].get(prob.key)
                if cubin is None:
                    continue
                try:
                    kern = Kernel(cubin, "flash_fwd_wgmma", space.layout(cfg, prob).smem_dynamic)
                    q, k, v = timing_inputs(d, dt, b, h, n)
                    o = torch.empty_like(q)
                    sec = time_fn(prepare(kern, cfg, q, k, v, o, None))
                    print(json.dumps({"ci": ci, "timing": label, "ms": sec * 1e3,
                                      "tflops": tflops(b, h, n, d, causal, sec)}), flush=True)
                except Exception as e:  # noqa: BLE001
                    print(json.dumps({"ci": ci, "timing": label, "fatal": f"{type(e).__name__}: {e}"[:400]}),
                          flush=True)
                    return 3
        print(json.dumps({"end": ci}), flush=True)
    return 0


def baselines() -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = {}
    for label, d, dt, causal, b, h, n in TIMING:
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                q, k, v = timing_inputs(d, dt, b, h, n)
                with sdpa_kernel(backend):
                    sec = time_fn(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                out[f"{label}|{name}"] = tflops(b, h, n, d, causal, sec)
            except Exception as e:  # noqa: BLE001
                out[f"{label}|{name}"] = f"{type(e).__name__}"
    return out


def baseline_worker() -> int:
    print(json.dumps({"baselines": baselines()}), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------------------------
# parent


def run_worker(args: list[str], out: Out, on_line, timeout_s: float, deadline: float) -> int | str:
    """Run this script as a worker; feed each JSON line to on_line; return its exit code, or 'timeout'."""
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1, cwd=str(ROOT))
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    last = time.time()
    last_text = [""]  # the worker's last non-JSON line (a traceback's last line says why it died)
    while True:
        if sel.select(timeout=1.0):
            line = proc.stdout.readline()
            if not line:
                break
            last = time.time()
            line = line.rstrip("\n")
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                out.note("worker: " + line)
                if line.strip():
                    last_text[0] = line.strip()
                continue
            on_line(msg)
        if time.time() - last > timeout_s or time.time() > deadline:
            proc.kill()
            proc.wait()
            return "timeout"
    rc = proc.wait()
    if rc and last_text[0]:
        out.say(f"    worker exit {rc}: {last_text[0][:200]}")
    return rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", nargs=2, metavar=("JOBS", "START"))
    ap.add_argument("--baselines", action="store_true")
    ap.add_argument("--quick", action="store_true", help="first 4 ladder configs only")
    ap.add_argument("--compile-only", action="store_true", help="stop after the builds (no GPU needed)")
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker[0], int(a.worker[1]))
    if a.baselines:
        return baseline_worker()

    t_start = time.time()
    deadline = t_start + DEADLINE_S
    out_dir = Path(os.environ.get("OUT", ROOT / "wgmma_probe_out"))
    out = Out(out_dir / "wgmma_probe.log")
    build_dir = Path(tempfile.mkdtemp(prefix="wgmma_probe_"))
    ladder = LADDER[:4] if a.quick else LADDER
    configs = [Config.make("wgmma", **d) for d in ladder]

    # 1. compile
    nvcc = nvcc_path()
    jobs = []
    skipped = {}
    for cfg in configs:
        for prob in PROBLEMS:
            why = space.violations(cfg, prob, ARCH)
            if why:
                skipped[(cfg.key, prob.key)] = "; ".join(str(v) for v in why)
            else:
                jobs.append((cfg, prob))
    out.say(f"# wgmma probe: {len(configs)} configs, {len(jobs)} builds ({len(skipped)} pruned by space/), "
            f"nvcc {nvcc}")
    builds = {}
    with cf.ThreadPoolExecutor(max_workers=os.cpu_count() or 4) as ex:
        for info in ex.map(lambda j: compile_one(nvcc, j[0], j[1], build_dir), jobs):
            builds[(info["cfg"], info["prob"])] = info
            out.note("build " + json.dumps(info))
    out.say(f"# compiled in {time.time() - t_start:.0f} s")
    for ci, cfg in enumerate(configs):
        regs = sorted({b["regs"] for (c, _), b in builds.items() if c == cfg.key and b["regs"]})
        spills = sum(sum(b["spill"] or (0, 0)) for (c, _), b in builds.items() if c == cfg.key)
        errs = [p for (c, p), b in builds.items() if c == cfg.key and not b["ok"]]
        out.say(f"c{ci:02d} {cfg.key} regs={regs} spill_bytes={spills}"
                + (f" COMPILE_ERROR {errs}" if errs else ""))
        for (c, p), b in builds.items():
            if c == cfg.key and not b["ok"]:
                out.say("    " + b["error"].strip().splitlines()[-1][:200] if b.get("error") else "")
            if c == cfg.key and b["warnings"]:
                out.say(f"    {p} warning: {b['warnings'][0][:200]}")
        for (c, p), why in skipped.items():
            if c == cfg.key:
                out.note(f"    {p} pruned: {why}")

    if a.compile_only:
        return 0 if all(b["ok"] for b in builds.values()) else 1

    jobs_json = {"configs": [
        {"cfg": cfg.key, "cubins": {p: b["cubin"] for (c, p), b in builds.items() if c == cfg.key and b["ok"]}}
        for cfg in configs]}
    jobs_path = build_dir / "jobs.json"
    jobs_path.write_text(json.dumps(jobs_json))

    # baselines first: safe, quick, and the table is worth little without them
    base = {}
    run_worker(["--baselines"], out, lambda m: base.update(m.get("baselines", {})), 60, deadline)
    out.say("# baselines (TFLOPS): " + ", ".join(f"{k}={v:.0f}" if isinstance(v, float) else f"{k}={v}"
                                                for k, v in base.items()))

    # 2 + 3. check and time, in a worker that restarts after a fault or hang
    status = {ci: "not run" for ci in range(len(configs))}
    fails = {ci: 0 for ci in range(len(configs))}
    cases = {ci: 0 for ci in range(len(configs))}
    perf: dict[tuple[int, str], float | str] = {}
    per_prob: dict[tuple[int, str], list] = {}
    current = {"ci": None}

    def on_line(msg):
        if "begin" in msg:
            current["ci"] = msg["begin"]
            status[msg["begin"]] = "running"
            return
        if "end" in msg:
            ci = msg["end"]
            status[ci] = "ok" if fails[ci] == 0 else "WRONG"
            for (c, p), rows in per_prob.items():
                if c == ci:
                    bad = [r for r in rows if not r["ok"]]
                    worst = max(rows, key=lambda r: r["err"])
                    out.say(f"c{ci:02d} {p:18s} {len(rows) - len(bad)}/{len(rows)} ok  worst err {worst['err']:.2e} "
                            f"(sdpa {worst['sdpa']:.2e}) lse {max(r['lse_err'] for r in rows):.1e}")
                    for r in bad[:4]:
                        out.say(f"    FAIL {r['case']} err={r['err']:.2e} sdpa={r['sdpa']:.2e} lse={r['lse_err']:.1e} "
                                f"nan={r['nan']} pad_written={r['pad_written']}")
            return
        ci = msg.get("ci")
        if "fatal" in msg:
            status[ci] = "CRASHED"
            out.say(f"c{ci:02d} FATAL {msg.get('prob', msg.get('timing'))}: {msg['fatal']}")
            return
        if "timing" in msg:
            perf[(ci, msg["timing"])] = msg["tflops"]
            out.say(f"c{ci:02d} time {msg['timing']:18s} {msg['ms']:.3f} ms  {msg['tflops']:.0f} TFLOPS")
            return
        cases[ci] += 1
        fails[ci] += 0 if msg["ok"] else 1
        per_prob.setdefault((ci, msg["prob"]), []).append(msg)
        out.note(f"c{ci:02d} {msg['prob']} {msg['case']} ok={msg['ok']} err={msg['err']:.3e} sdpa={msg['sdpa']:.3e} "
                 f"lse_err={msg['lse_err']:.2e} nan={msg['nan']} pad_written={msg['pad_written']}")

    start = 0
    while start < len(configs) and time.time() < deadline:
        rc = run_worker(["--worker", str(jobs_path), str(start)], out, on_line, CONFIG_TIMEOUT_S, deadline)
        if rc == 0:
            break
        ci = current["ci"] if current["ci"] is not None else start
        if status.get(ci) in ("running", "not run"):
            status[ci] = "HUNG" if rc == "timeout" else f"CRASHED(rc={rc})"
            out.say(f"c{ci:02d} {status[ci]}")
        start = ci + 1
        current["ci"] = None

    # summary (last in the output, so it survives truncation)
    out.say("")
    out.say(f"# summary ({time.time() - t_start:.0f} s): status, cases passed, TFLOPS per timing shape")
    out.say("cfg  status   pass    " + "  ".join(f"{t[0]:>16s}" for t in TIMING))
    for ci, cfg in enumerate(configs):
        cells = "  ".join(f"{perf[(ci, t[0])]:16.0f}" if isinstance(perf.get((ci, t[0])), float) else f"{'-':>16s}"
                          for t in TIMING)
        out.say(f"c{ci:02d}  {status[ci]:8s} {cases[ci] - fails[ci]:3d}/{cases[ci]:<3d} {cells}")
    for name in ("flash", "cudnn"):
        cells = "  ".join(f"{base[f'{t[0]}|{name}']:16.0f}" if isinstance(base.get(f"{t[0]}|{name}"), float)
                          else f"{str(base.get(f'{t[0]}|{name}', '-'))[:16]:>16s}" for t in TIMING)
        out.say(f"sdpa-{name:5s}          {cells}")
    for ci, cfg in enumerate(configs):
        out.say(f"c{ci:02d} = {cfg.key}")
    out.say(f"# log: {out_dir / 'wgmma_probe.log'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
