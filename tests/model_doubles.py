"""A stand-in for the tuned kernel in CPU tests of the drop-in entry points (runtime/sdpa.py, the transformers
backend): routing.kernel is replaced by PyTorch's own SDPA with enable_gqa (so GQA must arrive un-repeated, and
the results are PyTorch's), every call is recorded, and CPU tensors count as the kernel's device."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from autotune.runtime import fallbacks, routing  # noqa: E402


class StandInKernel:
    def __init__(self):
        self.calls: list[dict] = []

    def __call__(self, q, k, v, causal, scale, seqused_k=None):
        assert q.dim() == 4 and k.shape == v.shape and q.shape[1] % k.shape[1] == 0
        call = {"q": tuple(q.shape), "k": tuple(k.shape), "causal": causal, "scale": scale}
        if seqused_k is None:
            self.calls.append(call)
            return torch._C._nn.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                                             enable_gqa=True).contiguous()
        # The kernel's meaning of seqused_k: row b sees keys j < used[b], bottom-right causal aligned to it.
        assert seqused_k.dtype == torch.int32 and seqused_k.shape == (q.shape[0],) and causal in (False, "lower_right")
        self.calls.append({**call, "seqused_k": seqused_k.tolist()})
        i = torch.arange(q.shape[2])[:, None]
        j = torch.arange(k.shape[2])[None, :]
        used = seqused_k.clamp(0, k.shape[2]).long()[:, None, None, None]
        allowed = j < used
        if causal:
            allowed = allowed & (j <= i + used - q.shape[2])
        return torch._C._nn.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale,
                                                         enable_gqa=True).contiguous()


@pytest.fixture
def stand_in(monkeypatch) -> StandInKernel:
    kernel = StandInKernel()
    monkeypatch.setattr(routing, "kernel", kernel)
    monkeypatch.setattr(routing, "KERNEL_DEVICE_TYPES", ("cuda", "cpu"))
    fallbacks.reset()
    yield kernel
    fallbacks.reset()


def fallback_reasons() -> dict[str, int]:
    return {reason: n for (_, reason), n in fallbacks.counts().items()}
