"""landscapes: every valid config of a shape measured once, kept in a reviewable file, and replayed.

Owns: the landscape file format (landscape_file.py), the sweep that records one (sweep.py, with the evaluation
function its child process runs, sweep_eval.py), and the replay: a builder and an evaluator answered from the
file, with the search's interfaces (replay.py), so samplers can be studied without a GPU.

May import: build, launch, measure, store (and space/).

Public names: landscape_file.Landscape, Row, LandscapeError, load, dumps, default_path; sweep.run_sweeps,
SweepOptions, SweepError, SWEEP_EVALUATOR; replay.ReplayBuilder, ReplayEvaluator, NullStore, ReplayError.
"""
