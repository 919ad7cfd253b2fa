"""autotune: search the design space of a parameterized CUDA FlashAttention forward kernel."""
__version__ = "0.1.0"
