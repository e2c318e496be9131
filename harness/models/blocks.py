"""Parameters of a text model's post-LN attention block (BERT family: `layer.attention.output.LayerNorm`), for
kernels.block.block_map: the map Castin et al. measured on real data."""
from __future__ import annotations

from typing import Tuple, Union

import torch

from ..errors import UnsupportedContext
from . import hf, text


def post_ln(name: str, layer: int, pretrained: text.Pretrained = None, seed: int = 0,
            device: Union[str, torch.device] = "cpu", dtype=torch.float64) -> Tuple[torch.Tensor, torch.Tensor, float]:
    """(weight (d,), bias (d,), eps) of the LayerNorm after the residual of layer `layer`'s self-attention."""
    tm = text.load(name, pretrained, seed, device)
    mod = hf._layer(tm.model, int(layer))
    ln = getattr(getattr(getattr(mod, "attention", None), "output", None), "LayerNorm", None)
    if ln is None:
        raise UnsupportedContext(f"model {name!r} has no post-LN attention block (BertAttention: "
                                 "attention.output.LayerNorm); the block map is defined for BERT-family models")
    return (ln.weight.detach().to(device=device, dtype=dtype), ln.bias.detach().to(device=device, dtype=dtype),
            float(ln.eps))
