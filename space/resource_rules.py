"""Rules every family shares: what the arch's SM can hold at all (threads, shared memory, resident CTAs).

Each is a small named predicate (check(config, problem, arch, layout) -> None or why not); the families' traits
headers assert the same rules under the same names.
"""
from __future__ import annotations

from .config import Rule


def rule(name: str, doc: str):
    """Decorator: a predicate becomes a named Rule."""
    def deco(fn):
        return Rule(name, fn, doc)
    return deco


@rule("threads_per_block", "at most 1024 threads per block")
def threads_per_block(c, p, a, lay):
    if lay.threads > a.max_threads_per_block:
        return f"{lay.threads} threads > {a.max_threads_per_block}"


@rule("threads_per_sm", "THREADS × MIN_BLOCKS must fit the SM's thread slots")
def threads_per_sm(c, p, a, lay):
    if lay.threads * c.min_blocks > a.max_threads_per_sm:
        return f"{lay.threads} threads × min_blocks {c.min_blocks} > {a.max_threads_per_sm} per SM on {a.name}"


@rule("static_smem_limit", "static shared memory is limited to 48 KB")
def static_smem_limit(c, p, a, lay):
    if lay.smem_static > a.static_smem_limit:
        return f"static smem {lay.smem_static} B > {a.static_smem_limit} B"


@rule("smem_optin_limit", "total shared memory must fit the per-block opt-in limit of the arch")
def smem_optin_limit(c, p, a, lay):
    if lay.smem_total > a.smem_optin_per_block:
        return f"smem {lay.smem_total} B > {a.smem_optin_per_block} B opt-in limit on {a.name}"


@rule("min_blocks_smem", "MIN_BLOCKS CTAs must fit the SM's shared memory together")
def min_blocks_smem(c, p, a, lay):
    need = c.min_blocks * (lay.smem_total + a.smem_reserved_per_block)
    if c.min_blocks > 1 and need > a.smem_per_sm:
        return f"min_blocks {c.min_blocks} × ({lay.smem_total} + {a.smem_reserved_per_block}) B > {a.smem_per_sm} B per SM"


RESOURCE_RULES = (threads_per_block, threads_per_sm, static_smem_limit, smem_optin_limit, min_blocks_smem)
