"""compare-samplers on a small synthetic landscape: the simulation, its statistics and its report."""
from __future__ import annotations

import math

import pytest

import space
from autotune.search import sampler_comparison as compare
from autotune.search import comparison_report as compare_report
from autotune.landscapes import landscape_file as landscape_mod
from autotune.cli import main
from landscape_fixtures import small_landscape


@pytest.fixture(scope="module")
def landscape():
    return landscape_mod.loads(landscape_mod.dumps(small_landscape()))


def test_brute_force_finds_the_optimum_and_builds_each_config_once(landscape):
    n = len(landscape.rows)
    run = compare.simulate(landscape, "brute", seed=3, trials=n, lag=4, stop_fraction=None)
    assert len(run.values) == n  # every config a search can build, exactly once
    assert run.best_after(n) == landscape.optimum
    assert run.trials_to(landscape.optimum) <= n
    complete = sorted(r.tflops for r in landscape.complete_rows())
    assert sorted(v for v in run.values if v is not None) == complete  # the recorded values, nothing else


def test_a_run_stops_once_past_the_budget_and_the_target(landscape):
    run = compare.simulate(landscape, "random", seed=0, trials=len(landscape.rows), lag=0, stop_fraction=0.99,
                           min_trials=5)
    assert run.stop_reason == "reached 99% of the optimum"
    assert len(run.values) == max(5, run.trials_to(0.99 * landscape.optimum))  # the first trial both hold


def test_simulation_is_repeatable_per_seed(landscape):
    a = compare.simulate(landscape, "tpe", seed=7, trials=15, lag=3, stop_fraction=None)
    b = compare.simulate(landscape, "tpe", seed=7, trials=15, lag=3, stop_fraction=None)
    assert a.values == b.values and a.asks == b.asks
    default = space.default_config(landscape.shape.problem, landscape.arch, "wgmma")
    assert a.values[0] == landscape.row(default).tflops  # enqueued first, as the search does


def test_quantiles_keep_unreached_seeds_unreached():
    s = compare.Spread.of([4, 6, None, None])
    assert s.reached == 2 and s.seeds == 4
    assert s.p25 == pytest.approx(5.5) and math.isinf(s.median) and math.isinf(s.p75)
    assert compare.Spread.of([1, 2, 3]).median == 2


def test_unknown_sampler_is_named():
    with pytest.raises(ValueError, match="--samplers: .* 'annealing'"):
        compare.compare([], samplers=["annealing"])


def test_compare_reports_every_sampler_and_writes_the_doc_section(landscape, tmp_path, capsys):
    path = landscape.save(tmp_path / "small.json")
    doc = tmp_path / "search.md"
    doc.write_text(f"# Search\n\nhand-written intro\n\n{compare_report.BEGIN}\nold numbers\n{compare_report.END}\n\n"
                   "hand-written outro\n")
    argv = ["compare-samplers", "--replay", str(path), "--seeds", "3", "--trials", "20", "--budget", "10",
            "--samplers", "tpe", "random", "brute", "cmaes", "--jobs", "1", "--lag", "2", "--markdown", str(doc)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    text = doc.read_text()
    assert "hand-written intro" in text and "hand-written outro" in text and "old numbers" not in text
    assert text.count(compare_report.BEGIN) == 1 and text.count(compare_report.END) == 1
    for name in ("tpe", "random", "brute", "cmaes", "exhaustive"):
        assert f"| {name} |" in out or f"| **{name}** |" in out
    assert f"{landscape.optimum:.1f} TFLOPS" in out
    assert (tmp_path / "search-samplers.png").stat().st_size > 1000
    assert "![best found vs trials, median over seeds](search-samplers.png)" in text


def test_comparison_numbers_follow_from_the_runs(landscape):
    c = compare.compare([landscape], samplers=["random", "brute"], seeds=2, trials=len(landscape.rows), budget=5,
                        best_at=[2], lag=0, log=lambda _: None)
    (r,) = c.landscapes
    assert r.optimum == landscape.optimum and r.n_rows == len(landscape.rows) == r.cap
    second = sorted((x.tflops for x in landscape.complete_rows()), reverse=True)[1]
    assert r.runner_up == pytest.approx(second / r.optimum)
    assert r.spread == pytest.approx((0.01, 0.01), rel=1e-2)  # the fixture's p20/p80 are ±0.5 % of the median
    brute = r.samplers["brute"]
    assert brute.to_threshold[0.99].reached == 2  # exhaustive runs always get there
    for run in brute.runs:
        assert run.best_after(len(run.values)) >= 0.99 * r.optimum
    expected = sorted((run.best_after(5) or 0) / r.optimum for run in brute.runs)
    assert brute.best_at[5].median == pytest.approx(sum(expected) / 2)
    assert brute.best_at[2].median <= brute.best_at[5].median
    # each run stops once it is within the top threshold of the optimum (simulate's stop_fraction), not at it
    assert max(compare.THRESHOLDS) <= brute.curve_median[-1] <= 1.0
    text = compare_report.markdown(c)
    assert "best in 2 trials, % of optimum | best in 5 trials, % of optimum" in text
    with pytest.raises(ValueError, match="--best-at"):
        compare.compare([landscape], samplers=["random"], seeds=1, budget=5, best_at=[6], log=lambda _: None)


@pytest.mark.parametrize("n,good", [(3, 1), (5, 2), (6, 1), (4, 4)])
def test_the_random_order_expectation_is_exact(n, good):
    import itertools

    orders = list(itertools.permutations([True] * good + [False] * (n - good)))
    mean = sum(order.index(True) + 1 for order in orders) / len(orders)
    assert compare.expected_random_order(n, good, None) == pytest.approx(mean)
    # The default tried first, then the other n-1 in random order (the default is not good here).
    rest = list(itertools.permutations([True] * good + [False] * (n - good - 1))) if good < n else []
    if rest:
        mean_after = 1 + sum(order.index(True) + 1 for order in rest) / len(rest)
        assert compare.expected_random_order(n, good, False) == pytest.approx(mean_after)
    assert compare.expected_random_order(n, good, True) == 1.0


def test_docs_search_md_has_the_generated_section_markers():
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "search.md").read_text()
    assert text.count(compare_report.BEGIN) == 1 and text.count(compare_report.END) == 1
    assert text.index(compare_report.BEGIN) < text.index(compare_report.END)
