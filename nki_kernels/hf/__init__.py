"""HF transformers continuous batching through our kernels (simulator on CPU).

    from nki_kernels.hf import use_nki_attention
    use_nki_attention(model)                      # every attention layer: our kernels
    outputs = model.generate_batch(inputs=prompts, generation_config=config)

transformers' continuous batching accepts implementations named ``paged|eager``, ``sdpa`` or
containing ``flash`` (those get packed queries without a mask); ours registers as
``nki_paged_flash`` with transformers' ``AttentionInterface`` and is set on the model's config,
so its own cache, block tables and scheduler run unchanged. Needs the ``torch`` extra.
"""

from __future__ import annotations

IMPLEMENTATION = "nki_paged_flash"


def register(name: str = IMPLEMENTATION) -> str:
    """Register the implementation with transformers' attention interface under ``name`` (it
    must contain "flash" for continuous batching to accept it)."""
    if "flash" not in name:
        raise ValueError(f"name={name!r} must contain 'flash': transformers' continuous batching "
                         f"accepts only 'paged|eager', 'sdpa' and flash-named implementations")
    from transformers import AttentionInterface

    from .attention import nki_paged_attention_forward
    AttentionInterface.register(name, nki_paged_attention_forward)
    return name


def use_nki_attention(model, name: str = IMPLEMENTATION):
    """Register the implementation and make ``model`` use it (returns the model). Set on the
    config directly: ``set_attn_implementation`` would try to import a flash-attention package
    for any flash-named implementation."""
    model.config._attn_implementation = register(name)
    return model


__all__ = ["IMPLEMENTATION", "register", "use_nki_attention"]
