"""The docs say what the code does: every repository path they name exists, every count written as
"`autotune space ARGS`: N valid" is what that command prints today, and the recorded landscapes docs/search.md
lists are the files shipped in studies/landscapes/, named by one pattern, with the counts their headers hold."""
from __future__ import annotations

import glob
import json
import re
import shlex
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.store.storage_url import gpu_slug

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md", ROOT / "studies" / "tuned" / "README.md"]
LANDSCAPES = ROOT / "studies" / "landscapes"

# Paths from the repository root (`autotune/launch/tma.py`, `studies/landscapes/*.json`) and, as the docs also
# write them, from inside a package (`search/loop.py` is autotune/search/loop.py, `sm90/traits.cuh` is kernels/'s).
ROOTED = re.compile(r"(?<![\w/.<-])((?:autotune|space|kernels|benchmarks|studies|tests|docs|\.ci)/[\w./*+-]*[\w*])")
INSIDE = re.compile(r"(?<![\w/.<-])((?:search|landscapes|measure|store|build|launch|runtime|report|commands|sm80|"
                    r"sm90|common)/[\w./+-]*\.(?:py|cuh|cu|h))\b")
# Named on purpose though not in the repository, and why.
NOT_IN_THE_REPOSITORY = {
    "studies/autotune.db": "the default storage: the first search creates it (.gitignore'd)",
    "kernels/sm100": "the Blackwell-native family docs/arches.md describes as future work",
    "studies/campaigns/models-e2e.toml": "what benchmarks/models_e2e.py --capture writes on the GPU host (not yet)",
}


def named_paths() -> list[tuple[str, int, str, bool]]:
    """(doc, line, path, rooted) for every repository path the docs name."""
    found = []
    for doc in DOCS:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            found += [(doc.name, n, m.group(1).rstrip("."), True) for m in ROOTED.finditer(line)]
            found += [(doc.name, n, m.group(1), False) for m in INSIDE.finditer(line)]
    return found


def test_every_repository_path_in_the_docs_exists():
    paths = named_paths()
    assert len(paths) > 100  # the patterns still find what the docs name
    missing = [f"{doc}:{n}: {path}" for doc, n, path, rooted in paths
               if path not in NOT_IN_THE_REPOSITORY
               and not (glob.glob(str(ROOT / path)) if rooted
                        else glob.glob(str(ROOT / "autotune" / path)) or glob.glob(str(ROOT / "kernels" / path)))]
    assert not missing, "docs name files that do not exist:\n" + "\n".join(missing)


def test_the_paths_named_on_purpose_are_still_absent():
    """An entry of NOT_IN_THE_REPOSITORY that exists now is checked like any other path: drop it."""
    assert not [p for p in NOT_IN_THE_REPOSITORY if (ROOT / p).exists()]


# ---- counts that a command prints --------------------------------------------------------------------------

COUNT = re.compile(r"`autotune space ([^`]+)`: (\d+) valid")


def stated_counts() -> list[tuple[str, str, int]]:
    text = {doc.name: " ".join(doc.read_text().split()) for doc in DOCS}  # a statement may wrap lines
    return [(name, m.group(1), int(m.group(2))) for name, t in text.items() for m in COUNT.finditer(t)]


def counts_by_command() -> dict[str, list[tuple[str, int]]]:
    """The stated counts grouped by command (its arguments as one list of words): each command runs once however
    often the docs quote it (one run of a wgmma space is 400k configs judged, seconds)."""
    by_command: dict[str, list[tuple[str, int]]] = {}
    for doc, args, count in stated_counts():
        by_command.setdefault(" ".join(shlex.split(args)), []).append((doc, count))
    return by_command


def test_docs_state_counts_with_their_commands():
    assert len(stated_counts()) >= 3


@pytest.mark.parametrize("args", sorted(counts_by_command()))
def test_a_count_in_the_docs_is_what_its_command_prints(capsys, args):
    assert main(["space", *shlex.split(args)]) == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    wrong = [f"{doc}: {count}" for doc, count in counts_by_command()[args] if not summary.startswith(f"{count} valid, ")]
    assert not wrong, f"`autotune space {args}` now says: {summary[:80]}; the docs say " + ", ".join(wrong)


# ---- the recorded landscapes -----------------------------------------------------------------------------------

def headers() -> dict[str, dict]:
    """File name → header of every shipped landscape (the header is the file's first JSON object member)."""
    return {p.name: json.loads(p.read_text())["header"] for p in sorted(LANDSCAPES.glob("*.json"))}


def test_landscape_files_follow_one_naming_pattern():
    """<gpu>-<shape key>-<families>.json, and a later recording of the same shape the same with -<YYYY-MM-DD> of
    its header's date: each name says what the file holds, and no two files share one."""
    by_subject: dict[str, list[tuple[str, str]]] = {}
    for name, h in headers().items():
        subject = f"{gpu_slug(h['gpu_name'])}-{h['shape_key']}-{'+'.join(h['families'])}"
        day = h["date"][:10]
        assert name in (f"{subject}.json", f"{subject}-{day}.json"), (name, subject, day)
        by_subject.setdefault(subject, []).append((day, name))
    for subject, files in by_subject.items():
        dated = [name for _, name in files if name != f"{subject}.json"]
        assert len(dated) == len(files) - 1, f"{subject}: the first recording keeps the undated name: {files}"


def test_docs_search_lists_every_shipped_landscape_with_its_count():
    text = (ROOT / "docs" / "search.md").read_text()
    section = text[text.index("### The recorded landscapes"):text.index("## Replay")]
    rows = dict(re.findall(r"^\| `([\w.+-]+\.json)` \| [^|]+ \| (\d+) \|$", section, re.M))
    assert {name: int(n) for name, n in rows.items()} == {name: h["n_valid"] for name, h in headers().items()}


def test_every_landscape_has_its_own_replay_study(tmp_path, capsys):
    """Two recordings of one shape replayed into one storage: a study each (one name for both made the second
    replay fail with 'design space changed')."""
    url = f"sqlite:///{tmp_path / 'replays.db'}"
    same_shape = sorted(LANDSCAPES.glob("h200-b4-h16-n4096-d128-fp16-full-wgmma*.json"))
    assert len(same_shape) == 2
    for path in same_shape:
        assert main(["search", "--replay", str(path), "--trials", "2", "--storage", url]) == 0, capsys.readouterr()
    import optuna

    names = {s.study_name for s in optuna.get_all_study_summaries(url)}
    assert names == {f"replay-{p.stem}" for p in same_shape}


# ---- names that say what things do -----------------------------------------------------------------------------

# "issue" and its number, in a text or a file name: a reader of the repository cannot open it (not "we issue 17 %")
ISSUE_NUMBER = re.compile(r"\bissue[ _-]?\d+\b(?!\s*%)", re.I)


def test_no_file_or_text_refers_to_an_issue_number():
    where = [ROOT / d for d in ("docs", "benchmarks", "autotune", "tests", "space", "kernels", "studies/campaigns",
                                ".ci")] + [ROOT / "README.md", ROOT / "studies" / "tuned" / "README.md"]
    files = [p for w in where for p in ([w] if w.is_file() else w.rglob("*")) if p.is_file()
             and p.suffix in (".md", ".py", ".sh", ".toml", ".cu", ".cuh", ".h", "")]
    hits = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in files if "__pycache__" not in p.parts
            for m in [ISSUE_NUMBER.search(p.name)] + list(ISSUE_NUMBER.finditer(p.read_text(errors="replace"))) if m]
    assert not hits, "\n".join(hits)
