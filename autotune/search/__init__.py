"""search: an Optuna study over the kernel's design space for one shape, and the runs built on it.

Owns: the loop, top to bottom in one module (loop.py: open the study → queue the first configs → ask / build /
evaluate / tell → re-time the top and store the winner; one process, --workers and --replay differ only in what is
plugged in), what a search is asked and answers (options.py), the Optuna study and what its trials already tell
(study.py), one trial's verdict and how it is told (verdicts.py), the design space as Optuna parameters and the
samplers (sampling.py), the overlapping ask / build / evaluate stages (pipeline.py), progress lines and the
summary (progress.py), the final re-timing (retime.py), the processes sharing a study: heartbeats, claims and
stale trials (coordination.py), what becomes of a trial whose process died (deaths.py), the worker processes of
--workers (distributed.py), warm starts from tuned neighbours (warm_start.py), campaigns over many shapes
(campaign.py: the file and the order; campaign_run.py: the run, its budget and resuming; campaign_table.py: the
closing table), and samplers compared on recorded landscapes (sampler_comparison.py, comparison_report.py).

May import: build, launch, measure, store, landscapes (and space/).

Public names: loop.run_search, run_trials, run_worker, open_session, queue_first, finale, TrialLoop;
options.SearchOptions, SearchResult, SearchInterrupted, DEFAULT_TRIALS, DEFAULT_EVAL_TIMEOUT;
study.StudyMemory, open_study, StudyMismatchError; verdicts.Outcome, tell; sampling.SearchSpace, make_sampler,
SAMPLERS; progress.format_result; campaign.load, plan, neighbour_order; campaign_run.run; sampler_comparison.compare, simulate;
distributed.run_workers, WorkerRole, GpuLock, SqliteWorkersError; coordination.Solo, Shared, StudyLock,
StudyBusyError, retrying_storage.
"""
