"""build: a Config becomes a cubin and a compiler report. Runs on any machine with nvcc; no GPU.

Owns: finding nvcc and its version (nvcc.py), parsing ptxas's report into a BuildReport (ptxas.py), the
content-addressed, ninja-parallel Builder with its cache key and the provenance of what it builds
(builder.py), the spill policy that decides which builds are worth running (spill_policy.py), and the SASS
of a build's hot loop (sass.py).

May import: space/ only (and nvcc, ninja, nvdisasm as programs). Nothing else of autotune.

Public names: builder.Builder, BuildResult, BuildReport, BuildError, CacheIntegrityWarning, CubinMismatchError,
file_sha256, default_cache_dir, default_kernels_dir,
define_flags, family_sources, sources_digest, provenance, cubin_key; nvcc.find_nvcc, locate_nvcc, nvcc_version,
wheel_cuda_homes, NvccNotFoundError, WHEELS_HINT; ptxas.parse_report, parse_functions, PtxasParseError; spill_policy.SpillPolicy;
sass.disassemble, basic_blocks, find_loops, find_nvdisasm, NvdisasmNotFoundError.
"""
