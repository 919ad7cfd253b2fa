"""store: what autotune keeps of its own in a storage, and where storages are.

Owns: storage URLs (storage_url.py: argument → $AUTOTUNE_STORAGE → studies/autotune.db, the checkout root, the
GPU's short name in file and study names), the best-configuration-per-shape table with its export/import
format and the distance between shapes that nearest-neighbour lookups use (best_table.py: BestStore), the
claims table of shared storages (claims.py), and which storage errors pass and are retried (transient.py). Optuna's own tables are Optuna's; the search opens studies.

May import: space/ only. Nothing else of autotune.

Public names: storage_url.resolve_storage_url, prepare, describe, default_root, gpu_slug; best_table.BestStore,
BestEntry, RecordResult, StoreError, read_export, open_store, shape_distance; claims.Claims, Owner;
transient.call, is_transient, retry_seconds.
"""
