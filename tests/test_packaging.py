"""What a checkout and an installed wheel put on the import path.

`kernels/` holds CUDA sources, not Python: as a regular package it shadowed Hugging Face's `kernels`
distribution (which transformers >= 5.25 depends on and imports at `import transformers`) for every program
started at the checkout's root, pytest included. And an installed wheel must still find its kernel sources and
shipped tables by path."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_the_checkouts_kernels_directory_is_not_an_importable_package():
    assert not (REPO / "kernels" / "__init__.py").exists(), \
        "kernels/__init__.py makes the checkout's CUDA sources shadow the `kernels` distribution"
    # From the checkout's root (what `python -m pytest` and `python -c` put first on sys.path), `kernels`
    # resolves to the installed distribution when there is one, and never to a regular package here.
    probe = ("import importlib.util, json; s = importlib.util.find_spec('kernels'); "
             "print(json.dumps(s and s.origin))")  # a namespace portion has no origin
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    origin = json.loads(out.stdout)
    assert origin is None or not Path(origin).resolve().is_relative_to(REPO / "kernels"), origin


def test_transformers_imports_from_the_checkouts_root():
    pytest.importorskip("transformers")
    subprocess.run([sys.executable, "-c", "import transformers.integrations.hub_kernels"], cwd=REPO, check=True,
                   capture_output=True)


@pytest.mark.slow
def test_an_installed_wheel_finds_its_kernel_sources_and_tables(tmp_path):
    pytest.importorskip("setuptools")
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(REPO)], check=True, capture_output=True, cwd=tmp_path)
    wheel, = wheels.glob("autotune-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                    str(wheel)], check=True, capture_output=True, cwd=tmp_path)
    probe = ("from autotune.build.builder import default_kernels_dir; "
             "from autotune.runtime.lookup import shipped_tables_dir; "
             "print(default_kernels_dir()); print(shipped_tables_dir())")
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    kernels_dir, tables_dir = (Path(line) for line in out.stdout.split())
    assert kernels_dir.is_relative_to(target) and tables_dir.is_relative_to(target), out.stdout
    sources = sorted(p.relative_to(REPO / "kernels") for p in (REPO / "kernels").rglob("*")
                     if p.suffix in (".h", ".cuh", ".cu"))
    assert sources and all((kernels_dir / s).is_file() for s in sources), \
        [s for s in sources if not (kernels_dir / s).is_file()]
    assert (tables_dir / "h200.json").is_file()
