"""store: what autotune keeps of its own in a storage, and where storages are.

Owns: storage URLs (storage_url.py: argument → $AUTOTUNE_STORAGE → studies/autotune.db, the checkout root, the
GPU's short name in file and study names), the best-configuration-per-shape table with its export/import
format and the distance between shapes that nearest-neighbour lookups use (best_table.py: BestStore), the
claims table of shared storages (claims.py), the one path that creates tables while other processes may be
creating them too (tables.py: ours and Optuna's, every storage), and which storage errors pass and are retried
(transient.py: every storage call). Optuna's own tables are Optuna's; the search opens studies.

May import: space/ only. Nothing else of autotune.

Storage mistakes (a malformed URL, a missing directory or file, a corrupt file, a server that does not answer)
are one StorageError each, a line naming the URL or file and what to do (storage_url.prepare); a store opened
read_only creates and writes nothing. Every tuned row that comes from outside the search is checked by
best_table.row_problem, and a bad row costs that row only.

Public names: storage_url.resolve_storage_url, prepare, describe, default_root, gpu_slug, gpu_matches,
StorageError; best_table.BestStore, BestEntry, RecordResult, StoreError, ExportRows, read_export, row_problem,
row_matches, parse_config_key, write_atomically, open_store, shape_distance; claims.Claims, Owner;
transient.call, is_transient, retry_seconds (storage calls retried through a server restart); tables.create_missing,
create_with_others, created_meanwhile.
"""
