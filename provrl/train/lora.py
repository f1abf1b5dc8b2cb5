"""LoRA on the policy (peft): adapters injected in place, merged weights for the engines.

``add_lora(model, cfg)`` replaces each target ``nn.Linear`` by a peft LoRA layer
(``W x + (alpha / r)·B·A x``, B = 0 at init, so the policy is unchanged) and freezes every
other weight. ``merged_state_dict(model)`` is what engines and eval load: the model's own
state-dict names and dtypes, each adapted weight replaced by W + (alpha / r)·B·A, adapter
tensors left out — so an engine never knows LoRA was used.
"""

from __future__ import annotations

from typing import Any

import torch

from provrl.train.config import LoraConfig

ADAPTER = "default"


def add_lora(model: Any, cfg: LoraConfig) -> Any:
    """Inject LoRA adapters into ``model`` in place; only the adapters stay trainable."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import inject_adapter_in_model

    peft_cfg = PeftLoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        bias="none",
    )
    model = inject_adapter_in_model(peft_cfg, model, adapter_name=ADAPTER)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
    return model


def has_lora(model: Any) -> bool:
    """Whether ``model`` carries LoRA adapters (checked without importing peft)."""
    return any(hasattr(m, "lora_A") for m in model.modules())


def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """``model``'s state dict as the plain model's: ``x.base_layer.weight`` → ``x.weight``
    holding W + (alpha / r)·B·A (in W's dtype), adapter tensors dropped. Unadapted tensors
    are the model's own (no copy), so tied weights keep sharing storage."""
    from peft.tuners.lora import LoraLayer

    deltas: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, m in model.named_modules():
            if isinstance(m, LoraLayer) and ADAPTER in m.lora_A:
                layer: Any = m  # a lora.Linear: get_delta_weight = (alpha / r)·B·A
                w = layer.get_base_layer().weight
                delta = layer.get_delta_weight(ADAPTER).to(w.dtype)
                deltas[f"{name}.base_layer.weight"] = w + delta
    out: dict[str, torch.Tensor] = {}
    for k, v in model.state_dict().items():
        if ".lora_" in k:
            continue
        out[k.replace(".base_layer.", ".")] = deltas.get(k, v)
    return out


def lora_base_names(model: Any, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A plain model's ``state`` under ``model``'s LoRA names: ``x.weight`` of an adapted
    layer becomes ``x.base_layer.weight`` (what :func:`merged_state_dict` undoes)."""
    names = {k.replace(".base_layer.", "."): k for k in model.state_dict() if ".lora_" not in k}
    return {names.get(k, k): v for k, v in state.items()}


def reset_adapters(model: Any) -> None:
    """Every adapter back to its init (A random, B = 0): the policy is its base weights."""
    from peft.tuners.lora import LoraLayer

    for m in model.modules():
        if isinstance(m, LoraLayer) and ADAPTER in m.lora_A:
            layer: Any = m
            layer.reset_lora_parameters(ADAPTER, True)
