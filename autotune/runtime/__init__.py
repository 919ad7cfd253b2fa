"""runtime: `autotune.attention` — which config runs for a shape, and the torch op that runs it.

Owns: the lookup (lookup.py: the user's storage, the shipped tables, the nearest tuned shape, the heuristic
default; the built, loaded kernel per shape) and the custom op `autotune::flash_attention_fwd` with its input
checks (attention_op.py).

May import: build, launch, store (and space/). Never the search: the runtime reads the best-per-shape table,
never trials.

Public names: attention_op.attention, explain, clear_caches, OP_NAME; lookup.select_config, resolve, Selection,
heuristic, distance.
"""
