"""The decoder's linears with the step's adapters added, swapped in at load time.

A wrapped linear computes its base output, then adds each adapter group's low-rank term for
its rows (``LoraWeights.add``); with no token on an adapter this step it is the base linear.
The model's ``forward`` never sees LoRA: the runner groups the step's rows once
(``LoraWeights.begin_step``) and every wrapped linear reads them.
"""

from __future__ import annotations

import torch
from torch import nn

from izh_trio.engine.lora.weights import LoraWeights


class LoraLinear(nn.Module):
    def __init__(self, base: nn.Module, weights: LoraWeights, layer: int, linear: str) -> None:
        super().__init__()
        self.base = base
        self.weights = weights
        self.layer, self.linear = layer, linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        if self.weights.groups:
            self.weights.add(self.layer, self.linear, x, out)
        return out


def wrap_linears(model: nn.Module, weights: LoraWeights) -> int:
    """Wrap every linear an adapter may target, ``layers.<i>. ... .<linear>``; returns how
    many."""
    wrapped = 0
    for name, module in list(model.named_modules()):
        path = name.split(".")
        if len(path) >= 3 and path[0] == "layers" and path[-1] in weights.targets.parts:
            model.set_submodule(name, LoraLinear(module, weights, int(path[1]), path[-1]),
                                strict=True)
            wrapped += 1
    return wrapped
