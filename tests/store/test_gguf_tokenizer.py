"""The tokenizer rebuilt from GGUF metadata, against transformers' own GGUF tokenizer."""

import pytest
from tokenizers import Tokenizer

from store.errors import ModelFormatError
from store.gguf_tokenizer import build_tokenizer

STRINGS = [
    "Hello world",
    "Hello, world! How are you today?",
    " leading space",
    "trailing space ",
    "The quick brown fox jumps over the lazy dog.",
    "don't won't it's we're they've I'm you'll he'd",
    "CamelCaseIdentifier snake_case_name kebab-case-name",
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "import numpy as np\nnp.array([1, 2, 3]).reshape(-1, 1)",
    '{"key": "value", "list": [1, 2.5, null, true]}',
    "<html><body><p class=\"x\">Hi &amp; bye</p></body></html>",
    "SELECT * FROM users WHERE id = 42;",
    "1234567890",
    "3.14159265358979",
    "2024-06-01T12:34:56Z",
    "Version 1.2.3 released on 12/31/1999",
    "a1b2c3 x9y8z7",
    "😀😃😄 emoji 🎉🚀 test 👨‍👩‍👧‍👦",
    "你好，世界！今天天气很好。",
    "日本語のテキストとカタカナ",
    "한국어 텍스트",
    "Привет, мир! Ελληνικά. العربية",
    "Café naïve résumé façade",
    "    four spaces then text",
    "tabs\tand\ttabs\t\tdouble",
    "\n\nnewlines\n\n\nmore\r\nwindows",
    "   ",
    "mixed   \t\n  whitespace runs",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text<|im_end|>text",
    "<|im_start|><|im_start|>",
    "Special-ish but not special: <|im_sta rt|> <im_end>",
    "~!@#$%^&*()_+-=[]{}|;':\",./<>?`",
    "Zero-width\u200bjoiner and non\u00a0breaking space",
    "ÿ\x00\x01\x7f control bytes",
]


@pytest.fixture(scope="module")
def ours(smollm2_dir) -> Tokenizer:
    return Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def reference(smollm2_gguf):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)


def test_enough_strings():
    assert len(STRINGS) >= 30


@pytest.mark.model
@pytest.mark.parametrize("text", STRINGS)
def test_ids_match_transformers_gguf_tokenizer(ours, reference, text):
    assert ours.encode(text).ids == reference(text)["input_ids"]


@pytest.mark.model
@pytest.mark.parametrize("text", STRINGS)
def test_decode_encode_round_trip(ours, text):
    assert ours.decode(ours.encode(text).ids, skip_special_tokens=False) == text


@pytest.mark.model
def test_chat_markers_are_single_tokens(ours):
    ids = ours.encode("<|im_start|>user\nhi<|im_end|>").ids
    assert ids[0] == ours.token_to_id("<|im_start|>") == 1
    assert ids[-1] == ours.token_to_id("<|im_end|>") == 2
    assert ours.decode(ids, skip_special_tokens=True) == "user\nhi"


@pytest.mark.model
def test_smollm_digits_split_as_smollm2_does(ours, reference):
    """SmolLM2's own tokenizer (and llama.cpp) isolate digits first; transformers'
    GGUF loading does not (see store/gguf_tokenizer.py). We follow the model."""
    text = "\n\n1."
    double_newline, digit_one, dot = ours.token_to_id("ĊĊ"), ours.token_to_id("1"), ours.token_to_id(".")
    assert ours.encode(text).ids == [double_newline, digit_one, dot]
    newline = ours.token_to_id("Ċ")
    assert reference(text)["input_ids"] == [newline, newline, digit_one, dot]


@pytest.mark.model
def test_converted_dir_loads_in_transformers(smollm2_dir, ours):
    transformers = pytest.importorskip("transformers")
    loaded = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
    for text in STRINGS:
        assert loaded(text)["input_ids"] == ours.encode(text).ids
    assert (loaded.bos_token, loaded.eos_token, loaded.pad_token) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")


# --- tiny metadata, no model needed ---------------------------------------------------------


def _tiny_metadata(**overrides) -> dict:
    chars = [chr(c) for c in range(ord("!"), ord("~") + 1)] + ["Ġ", "Ċ"]
    tokens = chars + ["Ġt", "he", "Ġthe", "<|endoftext|>", "<think>"]
    metadata = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [1] * (len(tokens) - 2) + [3, 4],
        "tokenizer.ggml.merges": ["Ġ t", "h e", "Ġt he"],
        "tokenizer.ggml.bos_token_id": tokens.index("<|endoftext|>"),
    }
    return metadata | overrides


def test_tiny_merges_and_added_tokens():
    tokenizer = build_tokenizer(_tiny_metadata(), "tiny.gguf")
    pieces = tokenizer.encode("a the<|endoftext|><think>").tokens
    assert pieces == ["a", "Ġthe", "<|endoftext|>", "<think>"]
    ids = tokenizer.encode("a the<|endoftext|><think>").ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == "a the<think>"


def test_tiny_add_bos_token_prepends_bos():
    tokenizer = build_tokenizer(_tiny_metadata(**{"tokenizer.ggml.add_bos_token": True}), "tiny.gguf")
    assert tokenizer.encode("a").tokens == ["<|endoftext|>", "a"]
    assert tokenizer.encode("a", add_special_tokens=False).tokens == ["a"]


def test_unknown_tokenizer_model_is_refused():
    with pytest.raises(ModelFormatError, match=r"tiny\.gguf: tokenizer model 't5' is not supported"):
        build_tokenizer(_tiny_metadata(**{"tokenizer.ggml.model": "t5"}), "tiny.gguf")


def test_unknown_pre_tokenizer_is_refused():
    with pytest.raises(ModelFormatError, match="pre-tokenizer 'made-up' is not supported"):
        build_tokenizer(_tiny_metadata(**{"tokenizer.ggml.pre": "made-up"}), "tiny.gguf")
