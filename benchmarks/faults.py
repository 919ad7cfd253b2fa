#!/usr/bin/env python3
"""Fault drill: kill searches, restart their database, start several at once on a fresh SQLite file, stop them with
SIGTERM, run two on one SQLite study (by one path, then by two), then count what was lost. CPU only: every search
replays a synthetic landscape of every valid config of the current space's prefill slice (decode axes at their
defaults; tests/landscape_fixtures.py: made-up figures; a recorded landscape of studies/landscapes/ predates axes added
since, and a replay refuses configs it has no row for), each evaluation paced by
$AUTOTUNE_REPLAY_SECONDS so that faults land mid-trial. PostgreSQL is a throwaway cluster on 127.0.0.1
(tests/pg_server.py), deleted at the end.

    python3 benchmarks/faults.py                 # the table in docs/distributed.md (a few minutes on 2 cores)
    python3 benchmarks/faults.py --kills 5       # quicker

Faults:
  sigkill     --kills single searches on one SQLite study, each SIGKILLed at a random moment (seeded: a quarter
              while starting, the rest 0-3 s after the study is opened), then the same command run to the end;
  3 procs     three searches on one PostgreSQL study at once, one SIGKILLed mid-search; the other two finish;
  restart     --restarts times: a --workers 2 search on PostgreSQL while the server restarts (pg_ctl -m fast
              restart) about 2 s into it (the first 5 trials completed);
  first use   --rounds times: 3 searches of different studies started at once on a fresh SQLite file (each
              creating Optuna's tables and stamping alembic_version at the same moment); all must finish;
  sigterm     a single SQLite search and a --workers 2 PostgreSQL search (SIGTERM to its launcher alone, as
              `docker stop` does) sent SIGTERM mid-search: each must exit 143 within $AUTOTUNE_TERM_GRACE, then
              the same command runs to the end;
  sqlite x2   two searches started at once on one SQLite study: one must be refused up front; again with the
              second reaching the file through a hard link in another directory.

Columns: trials completed (COMPLETE trials in the study at the end, reuses of a result, retries and re-told
results included); trials lost (COMPLETE trials seen before a fault that are not COMPLETE with the same value
after it, trials killed after their measurement whose result was not re-told, and trials killed before it whose
config was neither re-queued nor judged later); configs timed twice (configs judged by more than one trial of
their own, i.e. not reusing another's result); trials left RUNNING. The last three must be 0; the script exits 1
otherwise. A config given up by autotune/search/deaths.py's rule (its process died twice while evaluating it) is
not counted as lost but named in the notes.
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the throwaway server of the tests
sys.path.insert(0, str(ROOT))

from landscape_fixtures import synthetic_landscape  # noqa: E402
from pg_server import PgServer, find_bin  # noqa: E402

KILL_BUDGET = 40  # evaluated trials of the SIGKILL study (of the landscape's several hundred valid configs)
LANDSCAPE: Path  # written by main() into the drill's work directory
GRACE = 3  # seconds without heartbeats before a killed process's trials are failed and re-queued


def search(storage: str, study: str, trials: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "autotune.cli", "search", "--replay", str(LANDSCAPE), "--storage", storage,
            "--study", study, "--trials", str(trials), "--sampler", "random", "--retime", "1", "--heartbeat", "1",
            "--grace", str(GRACE), *extra]


class Drill:
    def __init__(self, work: Path, pace: float):
        self.work = work
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOTUNE_REPLAY_SECONDS": str(pace),
                    "AUTOTUNE_LOCK_DIR": str(work / "locks"), "PYTHONUNBUFFERED": "1"}
        self.runs = 0
        self.procs: list[subprocess.Popen] = []

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def start(self, argv: list[str]) -> subprocess.Popen:
        self.runs += 1
        out = open(self.work / f"run-{self.runs}.log", "w")
        p = subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        p.log = out.name
        self.procs.append(p)
        return p

    def finish(self, p: subprocess.Popen, timeout: float = 600, ok=(0,)) -> int:
        p.wait(timeout)
        if p.returncode not in ok:
            print(Path(p.log).read_text()[-3000:], file=sys.stderr)
            raise SystemExit(f"faults.py: a search ended with exit {p.returncode} (log above: {p.log})")
        return p.returncode


def trials(storage: str, study: str) -> list:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)
    except KeyError:  # not created yet
        return []


def complete(storage: str, study: str) -> dict:
    return {t.number: t.value for t in trials(storage, study) if t.state.name == "COMPLETE"}


def wait_complete(storage: str, study: str, n: int, proc, timeout: float = 300) -> None:
    end = time.monotonic() + timeout
    while len(complete(storage, study)) < n:
        if proc.poll() is not None or time.monotonic() > end:
            raise SystemExit(f"faults.py: the search ended or stalled before {n} trials completed ({proc.log})")
        time.sleep(0.2)


def tally(fault: str, storage: str, study: str, seen: dict, note: str = "") -> dict:
    """The row of the table for one study; `seen`: COMPLETE trials (number → value) observed before faults."""
    return tally_many(fault, [(storage, study, seen)], note)


def tally_many(fault: str, studies: list[tuple[str, str, dict]], note: str = "") -> dict:
    """One row for several studies hit by the same fault: their counts summed."""
    rows = [_tally(storage, study, seen) for storage, study, seen in studies]
    notes = [note] + [n for r in rows for n in r.pop("notes")]
    total = {k: sum(r[k] for r in rows) for k in ("completed", "lost", "twice", "running")}
    return {"fault": fault, **total, "note": "; ".join(n for n in notes if n)}


def _tally(storage: str, study: str, seen: dict) -> dict:
    from autotune.search import deaths

    ts = trials(storage, study)
    by_number = {t.number: t for t in ts}
    lost = sum(1 for n, v in seen.items() if by_number[n].state.name != "COMPLETE" or by_number[n].value != v)
    key = lambda t: tuple(sorted(t.params.items()))  # noqa: E731
    judged = [t for t in ts if t.state.name in ("COMPLETE", "PRUNED")]
    retried = {n for t in ts for n in t.system_attrs.get("retry_history", [])}
    retold = {t.user_attrs.get("retold_for") for t in ts}
    judged_keys = {key(t) for t in judged}
    given_up = 0
    for t in ts:  # died holding a config: its measurement re-told, or the config re-queued or judged anyway
        if t.state.name != "FAIL" or not t.params or "running_in" in t.user_attrs \
                or (t.user_attrs.get("reason") or "").startswith(("interrupted", "cancelled")):
            continue
        fate = deaths.fate(t)
        if fate == "retell":
            lost += t.number not in retold  # a measurement made and not recorded
        elif fate == "give up" and key(t) not in judged_keys:
            given_up += 1  # by the rule, not lost: its process died while evaluating it twice (deaths.py)
        elif fate == "requeue":
            lost += t.number not in retried and key(t) not in judged_keys
    originals = Counter(key(t) for t in judged if t.user_attrs.get("status") not in (None, "invalid")
                        and "duplicate_of" not in t.user_attrs and "same_cubin_as" not in t.user_attrs)
    notes = []
    if retold - {None}:
        notes.append(f"{len(retold - {None})} measured trial(s) of killed processes re-told")
    if given_up:
        notes.append(f"{given_up} config(s) given up after their process died twice while evaluating them")
    return {"completed": sum(t.state.name == "COMPLETE" for t in ts), "lost": lost,
            "twice": sum(n > 1 for n in originals.values()), "running": sum(t.state.name == "RUNNING" for t in ts),
            "notes": notes}


def sigkills(drill: Drill, work: Path, kills: int, rng: random.Random) -> dict:
    url = f"sqlite:///{work / 'kills.db'}"
    seen: dict = {}
    moments = []
    for _ in range(kills):
        p = drill.start(search(url, "kills", KILL_BUDGET))
        if rng.random() < 0.25:  # while starting: imports, opening the study, failing the last run's trials
            moment = rng.uniform(0.2, 3.0)
        else:  # mid-search: asking, evaluating, telling (a Python start takes seconds on a loaded machine)
            while p.poll() is None and "study kills:" not in Path(p.log).read_text():
                time.sleep(0.05)
            moment = rng.uniform(0.0, 3.0)
        try:
            p.wait(moment)
        except subprocess.TimeoutExpired:
            seen.update(complete(url, "kills"))
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            moments.append(moment)
    before = len(seen)
    drill.finish(drill.start(search(url, "kills", KILL_BUDGET)))  # the same command again, to the end
    return tally(f"{kills} × SIGKILL, single search (SQLite)", url, "kills", seen,
                 f"{len(moments)} killed (a quarter while starting, the rest 0–3 s into the search); "
                 f"{before} trials completed before the last kill")


def three_processes(drill: Drill, pg: PgServer) -> dict:
    url = pg.create_database()
    procs = [drill.start(search(url, "three", 30, "--seed", str(i))) for i in range(3)]
    wait_complete(url, "three", 5, procs[0])
    seen = complete(url, "three")
    os.killpg(procs[1].pid, signal.SIGKILL)
    procs[1].wait()
    for p in (procs[0], procs[2]):
        drill.finish(p)
    died = sum(1 for t in trials(url, "three") if t.system_attrs.get("failed_trial") is not None)
    return tally("3 processes on one PostgreSQL study, 1 SIGKILLed", url, "three", seen,
                 f"{died} trial(s) of the killed one re-queued by the others")


def restart(drill: Drill, pg: PgServer, times: int) -> dict:
    studies, downs, retried = [], [], 0
    for _ in range(times):
        url = pg.create_database()
        p = drill.start(search(url, "restart", 30, "--workers", "2"))
        wait_complete(url, "restart", 5, p)
        seen = complete(url, "restart")
        t0 = time.monotonic()
        # -l: the restarted server must not inherit our pipes (pg_ctl would never return)
        r = pg._run(pg.pg_ctl, "-D", str(pg.data), "-l", str(pg.log), "-m", "fast", "-w", "-t", "60", "restart")
        if r.returncode:
            raise SystemExit(f"faults.py: pg_ctl restart failed:\n{r.stdout}\n{r.stderr}")
        downs.append(time.monotonic() - t0)
        drill.finish(p)
        retried += sum("storage is unreachable" in line for line in Path(p.log).read_text().splitlines())
        studies.append((url, "restart", seen))
    return tally_many(f"PostgreSQL restart mid-search (--workers 2), {times} runs", studies,
                      f"pg_ctl -m fast restart took {min(downs):.1f}-{max(downs):.1f} s; {retried} operation(s) "
                      f"retried; {times} of {times} searches exit 0")


def first_use(drill: Drill, work: Path, rounds: int) -> dict:
    studies = []
    for round_ in range(rounds):
        url = f"sqlite:///{work / f'fresh-{round_}.db'}"
        procs = [drill.start(search(url, f"s{i}", 6, "--seed", str(i))) for i in range(3)]
        for p in procs:
            drill.finish(p)  # a raw traceback ("table ... already exists") ends the drill here
        studies += [(url, f"s{i}", {}) for i in range(3)]
    return tally_many(f"3 searches started at once on a fresh SQLite file, {rounds} rounds", studies,
                      f"{3 * rounds} of {3 * rounds} processes exit 0")


def sigterm(drill: Drill, pg: PgServer, work: Path) -> dict:
    """SIGTERM mid-search, as a scheduler stops a job; exit 143 within the grace period; then run to the end."""
    grace = 20
    drill.env["AUTOTUNE_TERM_GRACE"] = str(grace)
    runs = [(f"sqlite:///{work / 'term.db'}", (), "group"), (pg.create_database(), ("--workers", "2"), "launcher")]
    studies, took = [], []
    for url, extra, whom in runs:
        p = drill.start(search(url, "term", 30, *extra))
        wait_complete(url, "term", 5, p)
        seen = complete(url, "term")
        t0 = time.monotonic()
        if whom == "group":
            os.killpg(p.pid, signal.SIGTERM)  # Slurm: every process of the job
        else:
            p.send_signal(signal.SIGTERM)     # docker stop, Kubernetes: the first process only
        drill.finish(p, timeout=grace + 30, ok=(143,))
        took.append(time.monotonic() - t0)
        if took[-1] > grace:
            raise SystemExit(f"faults.py: SIGTERM took {took[-1]:.1f} s to end a search, more than {grace} s")
        drill.finish(drill.start(search(url, "term", 30, *extra)))  # the same command again, to the end
        studies.append((url, "term", seen))
    return tally_many("SIGTERM mid-search: SQLite single search (to the group), PostgreSQL --workers 2 (to the "
                      "launcher alone)", studies,
                      f"both exit 143 within {max(took):.1f} s (grace {grace} s), then resumed to the end")


def two_sqlite(drill: Drill, work: Path, linked: bool = False) -> dict:
    where = work / ("two-linked" if linked else "two")
    where.mkdir()
    url = f"sqlite:///{where / 'two.db'}"
    paths = [url, url]
    if linked:  # the second search names the same file through a hard link in another directory
        sqlite3.connect(where / "two.db").close()
        (work / "elsewhere").mkdir()
        os.link(where / "two.db", work / "elsewhere" / "link.db")
        paths[1] = f"sqlite:///{work / 'elsewhere' / 'link.db'}"
    procs = [drill.start(search(u, "two", 20, "--seed", str(i))) for i, u in enumerate(paths)]
    codes = sorted(drill.finish(p, ok=(0, 2)) for p in procs)
    if codes != [0, 2]:
        raise SystemExit(f"faults.py: two searches on one SQLite study ended {codes}, expected one refused (2)")
    refused = next(p for p in procs if p.returncode == 2)
    why = Path(refused.log).read_text().strip().splitlines()[-1]
    assert "being searched by another process" in why, why
    if linked:
        return tally("2 processes on one SQLite study, the second through a hard link", url, "two", {},
                     "the second refused up front (exit 2)")
    return tally("2 processes on one SQLite study", url, "two", {}, "the second refused up front (exit 2)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=20, help="SIGKILLed single searches (default 20)")
    ap.add_argument("--seed", type=int, default=0, help="seeds the kill moments (default 0)")
    ap.add_argument("--pace", type=float, default=0.2, help="seconds per replayed evaluation (default 0.2)")
    ap.add_argument("--restarts", type=int, default=3, help="restarts of PostgreSQL under --workers (default 3)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of parallel first use of SQLite (default 5)")
    args = ap.parse_args()
    initdb, pg_ctl = find_bin("initdb"), find_bin("pg_ctl")
    if not initdb or not pg_ctl:
        print("faults.py: PostgreSQL's initdb/pg_ctl not found (apt-get install postgresql)", file=sys.stderr)
        return 2
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="autotune-faults-"))
    global LANDSCAPE
    LANDSCAPE = synthetic_landscape().save(work / "landscape.json")
    drill = Drill(work, args.pace)
    pg = PgServer(initdb, pg_ctl)
    pg.start()
    try:
        rows = [sigkills(drill, work, args.kills, random.Random(args.seed)), three_processes(drill, pg),
                restart(drill, pg, args.restarts), first_use(drill, work, args.rounds), sigterm(drill, pg, work),
                two_sqlite(drill, work), two_sqlite(drill, work, linked=True)]
    finally:
        drill.kill_all()  # a drill that failed half-way leaves no search running
        pg.stop()
    print(f"| fault | trials completed | trials lost | configs timed twice | trials left RUNNING | notes |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['fault']} | {r['completed']} | {r['lost']} | {r['twice']} | {r['running']} | {r['note']} |")
    print(f"\n{drill.runs} search processes, {time.monotonic() - started:.0f} s; logs in {work}")
    return 1 if any(r["lost"] or r["twice"] or r["running"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
