"""runtime: `autotune.attention` — which config runs for a shape, and the torch op that runs it.

Owns: the lookup (lookup.py: the user's storage, the shipped tables, the nearest tuned shape, the heuristic
default; the built, loaded kernel per shape) and the custom op `autotune::flash_attention_fwd` with its input
checks (attention_op.py). For models: shape buckets (buckets.py) and capture into a campaign file (capture.py),
benchmark mode for untuned shapes (benchmark_mode.py) and the order of exact rows it and the buckets add
(row_order.py); the drop-in entry points' routing (routing.py: what the kernel runs), their fallback counts
(fallbacks.py) and the SDPA-compatible call (sdpa.py).

May import: build, launch, store (and space/). Never the search: the runtime reads the best-per-shape table,
never trials.

Public names: attention_op.attention, explain, clear_caches, OP_NAME; lookup.select_config, resolve, Selection,
heuristic, distance; sdpa.scaled_dot_product_attention, patch_sdpa; capture.capture, start, stop, read,
CaptureFile; benchmark_mode.set_benchmark_mode; fallbacks.counts, reset, FallbackWarning; routing.unsupported,
causal_argument, kernel; buckets.bucket, bucket_size; row_order.BENCHMARKED_STUDY, is_benchmarked.
"""
