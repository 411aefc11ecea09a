"""GGUF -> HF directory conversion, against transformers' own GGUF loading."""

import functools
import json
import os

import pytest
import torch
from safetensors import safe_open


from store import model_store
from store.block_file import BLOCKS_FILE, read_block_file
from store.errors import ModelFormatError
from store.gguf_import import convert_gguf
from tests.model.hf_reference import dequantized_state_dict

transformers = pytest.importorskip("transformers")
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint  # noqa: E402
from gguf import GGUFReader as _GGUF_READER  # noqa: E402


@functools.cache
def _reference_config(gguf_path: str) -> dict:
    """transformers' config of a GGUF file (read once a file: the default model's takes seconds, its vocabulary
    parsed too)."""
    return load_gguf_checkpoint(gguf_path)["config"]


@pytest.fixture(scope="module", autouse=True)
def _parse_once():
    """What transformers parses again and again, parsed once in this module: a file's GGUFReader (the
    default model's vocabulary takes ~6 s to read into fields; readers only read) and gguf's tensor-name
    map (transformers builds the same one for each of ~400 submodules it walks)."""
    import gguf

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
        patch.setattr(gguf, "GGUFReader", _reader)  # transformers imports it from gguf when it loads a file
        yield


def _reader(path):
    stat = os.stat(path)
    return _parsed_reader(str(path), stat.st_size, stat.st_mtime_ns)


@functools.cache
def _parsed_reader(path: str, size: int, mtime_ns: int):
    return _GGUF_READER(path)


def _reference_state_dict(gguf_path) -> dict[str, torch.Tensor]:
    """transformers' GGUF loading (the code `from_pretrained(..., gguf_file=)` runs), without
    needing accelerate: its own config, a meta-device model for the name map, its dequantizer."""
    config_dict = dict(_reference_config(str(gguf_path)))
    config = transformers.AutoConfig.for_model(**config_dict)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=model)["tensors"]


def _assert_same_tensors(ours: dict, reference: dict, atol: float = 1e-6) -> None:
    assert sorted(ours) == sorted(reference)
    for name, tensor in reference.items():
        got = torch.as_tensor(ours[name])
        assert got.dtype == torch.float32, name
        assert got.shape == tensor.shape, name
        torch.testing.assert_close(got, tensor.to(torch.float32), atol=atol, rtol=0, msg=name)


# --- the real default model -----------------------------------------------------------------


@pytest.mark.model
@pytest.mark.slow
def test_smollm2_weights_match_transformers(smollm2_dir, smollm2_gguf):
    _assert_same_tensors(dequantized_state_dict(smollm2_dir), _reference_state_dict(smollm2_gguf))


@pytest.mark.model
def test_smollm2_config(smollm2_dir, smollm2_gguf):
    config = json.loads((smollm2_dir / "config.json").read_text())
    reference = _reference_config(str(smollm2_gguf))
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings", "tie_word_embeddings",
                "bos_token_id", "eos_token_id", "pad_token_id"):
        assert config[key] == reference[key], key
    assert config["rope_theta"] == pytest.approx(reference["rope_theta"])
    assert config["rms_norm_eps"] == 1e-5  # the float32 1e-5 in the file, spelled as trained
    assert (config["vocab_size"], config["hidden_size"], config["num_hidden_layers"]) == (49152, 576, 30)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    assert config["tie_word_embeddings"] is True and "rope_scaling" not in config
    assert "lm_head.weight" not in dequantized_state_dict(smollm2_dir)
    generation = json.loads((smollm2_dir / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}


@pytest.mark.model
def test_smollm2_tokenizer_config_has_chat_template(smollm2_dir, smollm2_gguf):
    tokenizer_config = json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    template = _reader(smollm2_gguf).fields["tokenizer.chat_template"].contents()
    assert tokenizer_config["chat_template"] == template
    assert "<|im_start|>" in template
    assert tokenizer_config["bos_token"] == "<|im_start|>"
    assert tokenizer_config["eos_token"] == tokenizer_config["pad_token"] == "<|im_end|>"
    assert tokenizer_config["unk_token"] == "<|endoftext|>"
    assert tokenizer_config["model_max_length"] == 8192
    assert tokenizer_config["added_tokens_decoder"]["2"]["content"] == "<|im_end|>"


@pytest.mark.model
def test_pull_is_idempotent(smollm2_dir):
    weights = smollm2_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert model_store.pull("smollm2-135m-instruct", progress=False) == smollm2_dir
    assert model_store.resolve_model_dir("smollm2-135m-instruct") == smollm2_dir
    assert weights.stat().st_mtime_ns == before


# --- tiny GGUF files, written here ----------------------------------------------------------


@pytest.mark.parametrize(
    "arch, tie, bias",
    [("llama", True, False), ("llama", False, False), ("llama", False, True), ("qwen2", False, True)],
)
def test_tiny_conversion_recovers_hf_weights(tmp_path, tiny_gguf, arch, tie, bias):
    """Written as llama.cpp would (q/k permuted for llama), read back as the HF originals."""
    hf = tiny_gguf(tmp_path / "tiny.gguf", arch, tie_word_embeddings=tie, qkv_bias=bias)
    out = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "out", progress=False)
    ours = dequantized_state_dict(out)
    _assert_same_tensors(ours, {name: torch.from_numpy(array) for name, array in hf.items()}, atol=0)
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is tie
    assert config["attention_bias"] is bias
    assert config["model_type"] == arch


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_conversion_matches_transformers(tmp_path, tiny_gguf, arch):
    tiny_gguf(tmp_path / "tiny.gguf", arch, tie_word_embeddings=False, qkv_bias=arch == "qwen2")
    out = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "out", progress=False)
    _assert_same_tensors(dequantized_state_dict(out), _reference_state_dict(tmp_path / "tiny.gguf"))


def test_tiny_safetensors_header_is_aligned(tmp_path, tiny_gguf):
    tiny_gguf(tmp_path / "tiny.gguf")
    out = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "out", progress=False)
    raw = (out / "model.safetensors").read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + header_len])
    assert (8 + header_len) % 8 == 0
    data_end = max(entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__")
    assert data_end == len(raw) - 8 - header_len


def test_unsupported_architecture_is_refused(tmp_path, unsupported_gguf):
    path = unsupported_gguf
    with pytest.raises(ModelFormatError) as error:
        convert_gguf(path, tmp_path / "out", progress=False)
    assert str(path) in str(error.value) and "'gptneox' is not supported" in str(error.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("keep_fraction", [0.0, 0.001, 0.3, 0.7, 0.999])
def test_truncated_gguf_is_refused(tmp_path, tiny_gguf, keep_fraction):
    path = tmp_path / "cut.gguf"
    tiny_gguf(path)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep_fraction)])
    with pytest.raises(ModelFormatError, match="cut.gguf: .*(truncated|not a GGUF)"):
        convert_gguf(path, tmp_path / "out", progress=False)


def test_not_a_gguf_file_is_refused(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("just some text, long enough to hold a header")
    with pytest.raises(ModelFormatError, match="bad magic"):
        convert_gguf(path, tmp_path / "out", progress=False)


def test_missing_file_is_refused(tmp_path):
    with pytest.raises(ModelFormatError, match="cannot read"):
        convert_gguf(tmp_path / "absent.gguf", tmp_path / "out", progress=False)
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("arch, tie", [("llama", True), ("llama", False), ("qwen2", False)])
def test_quantized_conversion_keeps_blocks_of_the_same_values(tmp_path, tiny_gguf, arch, tie):
    """Q4_1 / Q8_0 tensors come out as their blocks only, in gguf_blocks.safetensors (GGUF's own
    layout, q/k rows un-permuted), with no float32 copy; they decode to exactly the weights."""
    hf = tiny_gguf(tmp_path / "tiny.gguf", arch, tie_word_embeddings=tie, quantized=True)
    out = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "out", progress=False)
    _assert_same_tensors(dequantized_state_dict(out), {name: torch.from_numpy(array) for name, array in hf.items()}, atol=0)
    blocks = read_block_file(out)
    expected_formats = {name: "Q8_0" if "embed_tokens" in name else "Q4_1"
                        for name, array in hf.items() if array.ndim == 2 and array.shape[1] % 32 == 0}
    assert {name: weight.format for name, weight in blocks.items()} == expected_formats
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        float_names = set(f.keys())
    assert not float_names & set(blocks)  # no float32 copy of a block tensor
    assert "model.layers.0.mlp.down_proj.weight" in float_names  # 48 wide: stored float32


def test_float_gguf_has_no_blocks_file(tmp_path, tiny_gguf):
    tiny_gguf(tmp_path / "tiny.gguf")
    out = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "out", progress=False)
    assert not (out / BLOCKS_FILE).exists()
