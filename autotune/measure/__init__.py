"""measure: is a built kernel right, and how fast is it. One discipline for our kernels and torch's alike.

Owns: the fp32 reference (reference.py), the correctness check on poisoned outputs (check.py), timing with
warm-up, L2 flush and CUDA events (timing.py), one build's evaluation and the baselines: SDPA's backends and
the peers outside torch (evaluate.py; FlashAttention-4 in peer_fa4.py, optional),
the evaluator child process that keeps a faulting or hanging kernel from taking the caller down
(child_process.py: Worker, Evaluator, EvalOutcome), and signal handling for the processes that do this work
(interrupts.py: Ctrl-C deferred during storage writes, children that die with their parent).

May import: build, launch (and space/).

Public names: evaluate.evaluate, Evaluation, sdpa_baselines, context_alive; child_process.Evaluator, Worker,
EvalOutcome, EvaluatorError, WorkerStartError, DEFAULT_EVALUATOR; check.check, make_inputs;
timing.bench, timing.bench_graph, Timing; reference.reference_attention; peer_fa4.fa4_timing, PeerUnavailable; interrupts.critical, deferred_interrupts, exit_with_parent.
"""
