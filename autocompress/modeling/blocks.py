"""Where a causal LM keeps its decoder blocks."""

from __future__ import annotations

from torch import nn

from autocompress.errors import AutoCompressError


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder blocks of a supported causal LM (``….model.layers``: Llama family,
    hetero), also when it is wrapped (e.g. ``DistillStudent.student.model.layers``)."""
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == "layers" and isinstance(module, nn.ModuleList):
            return module
    raise AutoCompressError(
        f"{type(model).__name__} has no decoder layers (model.layers)",
        hint="importance, pruning and FSDP support Llama, Mistral, Qwen2, Qwen3 and hetero models",
    )
