"""integrations: autotune inside other libraries' models.

Owns: the transformers attention backend (transformers.py: `attn_implementation="autotune"`, registered through
transformers' public AttentionInterface when the module is imported).

May import: runtime (and space/). It reaches the kernel only through runtime's drop-in routing (routing.py,
fallbacks.py), so what runs on the kernel, and why a call falls back, is decided in one place for every entry point.

Public names: transformers.register, attention_forward, NAME.
"""
