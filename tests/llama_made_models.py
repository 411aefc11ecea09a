"""Tiny random HF models of each family, and the GGUF files llama.cpp's own tools make of them.

`made_model(tools, family)` builds (once; cached under $RADIXSERVE_HOME/test-models, keyed by a
hash of the recipe and of llama.cpp's converter) a tiny random model with `transformers`, with a
tokenizer llama.cpp's converter accepts, then runs `convert_hf_to_gguf.py --outtype f16 / bf16 / q8_0`
and `llama-quantize` to Q4_K_M, Q6_K, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K_M and Q5_K_M: every block type the
cpu backend holds (Q3_K_M and Q5_K_M also carry Q4_K / Q6_K tensors, Q2_K's Q3_K/Q4_K ones).

Tokenizers: the byte-level BPE families take SmolLM2's tokenizer.json (one llama.cpp's converter
knows by hash: pre-tokenizer "smollm"), except Qwen's: transformers 5 loads any tokenizer of a
qwen2/qwen3 model as Qwen2Tokenizer (Qwen's split over the given vocabulary), whose hash
llama.cpp knows only for Qwen's own vocabulary, so they get Qwen2's real one, rebuilt from
llama.cpp's models/ggml-vocab-qwen2.gguf (which test_gguf_families_llama holds to Qwen2's HF
ids); the SentencePiece families (Gemma 2/3, Phi-3) get a
SentencePiece-BPE model trained here on llama.cpp's README, shaped like the family's own (ids of
<pad>/<eos>/<bos>/<unk>, the chat markers), and an HF tokenizer as the family ships it.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

from tests.llama_tools import LlamaTools

RECIPE_VERSION = 3  # bump when a recipe below changes: the made files are cached by it
_CONVERTED = ("F16", "BF16", "Q8_0")  # convert_hf_to_gguf.py --outtype
_QUANTIZED_BY_TOOL = ("Q4_K_M", "Q6_K", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_M", "Q5_K_M")  # llama-quantize, from F16
GGUF_TYPES = _CONVERTED + _QUANTIZED_BY_TOOL
DEFAULT_MODEL = "smollm2-135m-instruct"
# K-quants need rows of whole 256-weight super-blocks: every matrix here is 256 or 512 wide
SHAPE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64)

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>"
    "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
PHI3_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
PHI3_ADDED = ("<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>", "<|user|>")


class Family(NamedTuple):
    name: str  # the test's name for it
    gguf_architecture: str
    tokenizer: str  # "smollm2" (byte-level BPE) or "gemma" / "phi3" (SentencePiece)


FAMILIES = {
    "llama3": Family("llama3", "llama", "smollm2"),
    "mistral": Family("mistral", "llama", "smollm2"),
    "qwen2": Family("qwen2", "qwen2", "qwen2"),
    "qwen3": Family("qwen3", "qwen3", "qwen2"),
    "gemma2": Family("gemma2", "gemma2", "gemma"),
    "gemma3": Family("gemma3", "gemma3", "gemma"),
    "phi3": Family("phi3", "phi3", "phi3"),
}


class MadeModel(NamedTuple):
    hf_dir: Path  # the source HF model (config.json, model.safetensors, tokenizer files)
    gguf_paths: dict[str, Path]  # GGUF type -> the file llama.cpp's tools made


def test_models_home() -> Path:
    home = Path(os.environ.get("RADIXSERVE_HOME") or Path.home() / ".cache" / "radixserve").expanduser()
    return home / "test-models"


def made_model(tools: LlamaTools, family_name: str) -> MadeModel:
    family = FAMILIES[family_name]
    # the tools are named by their source tree (llama-cpp-python's version)
    key = hashlib.sha256(json.dumps([RECIPE_VERSION, family, str(tools.source_dir)]).encode()).hexdigest()[:16]
    out = test_models_home() / f"{family.name}-{key}"
    gguf_paths = {t: out / f"model-{t}.gguf" for t in GGUF_TYPES}
    if all(p.is_file() for p in gguf_paths.values()):
        return MadeModel(out / "hf", gguf_paths)
    partial = out.with_name(out.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    hf_dir = partial / "hf"
    _write_hf_model(family, hf_dir)
    env = {**os.environ, "PYTHONPATH": str(tools.source_dir / "gguf-py"), "NO_LOCAL_GGUF": ""}
    for outtype in _CONVERTED:
        subprocess.run([sys.executable, str(tools.convert_script), str(hf_dir), "--outtype", outtype.lower(),
                        "--outfile", str(partial / f"model-{outtype}.gguf")],
                       check=True, env=env, capture_output=True)
    for qtype in _QUANTIZED_BY_TOOL:
        subprocess.run([str(tools.quantize), str(partial / "model-F16.gguf"), str(partial / f"model-{qtype}.gguf"),
                        qtype], check=True, capture_output=True)
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return MadeModel(out / "hf", gguf_paths)


def imported_dir(made: MadeModel, family_name: str, gguf_type: str) -> Path:
    """radixserve's import of the made file (store.gguf_import), redone when the file or the
    importer changed."""
    from store.gguf_import import CONVERTER_VERSION, convert_gguf

    source = made.gguf_paths[gguf_type]
    out = test_models_home() / "imported" / f"{family_name}-{gguf_type}"
    importer = Path(__file__).parents[1] / "store"
    stamp_text = json.dumps([str(source), source.stat().st_mtime_ns, CONVERTER_VERSION,
                             {p.name: p.stat().st_mtime_ns for p in sorted(importer.glob("*.py"))}])
    stamp = out / "imported-from.json"
    if not (stamp.is_file() and stamp.read_text() == stamp_text):
        shutil.rmtree(out, ignore_errors=True)
        convert_gguf(source, out, progress=False)
        stamp.write_text(stamp_text)
    return out


def _write_hf_model(family: Family, hf_dir: Path) -> None:
    import torch

    hf_dir.mkdir(parents=True)
    tokenizer = _write_tokenizer(family, hf_dir)
    config = _config(family, len(tokenizer), tokenizer)
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                # random norms: Gemma's are stored as w + 1, so zeros would hide a missing undo
                param.copy_(torch.randn_like(param) * 0.2 + (0.0 if "gemma" in family.name else 1.0))
            elif param.ndim == 1:  # biases
                param.copy_(torch.randn_like(param) * 0.1)
            else:  # weights large enough that logits are not flat
                param.copy_(torch.randn_like(param) * (1.0 / param.shape[-1] ** 0.5))
    model.save_pretrained(hf_dir)
    generation = transformers.GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                                               pad_token_id=config.pad_token_id)
    generation.save_pretrained(hf_dir)


def _config(family: Family, vocab_size: int, tokenizer):
    import transformers

    special = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id)
    common = dict(SHAPE, vocab_size=vocab_size, num_hidden_layers=2, rms_norm_eps=1e-5, **special)
    if family.name == "llama3":
        return transformers.LlamaConfig(
            **common, max_position_embeddings=131072, tie_word_embeddings=True,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    if family.name == "mistral":
        return transformers.MistralConfig(**common, max_position_embeddings=32768, sliding_window=None,
                                          rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    if family.name == "qwen2":
        return transformers.Qwen2Config(**common, max_position_embeddings=32768, tie_word_embeddings=True,
                                        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    if family.name == "qwen3":
        return transformers.Qwen3Config(**common, max_position_embeddings=40960, tie_word_embeddings=True,
                                        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    if family.name == "gemma2":
        return transformers.Gemma2Config(**common, max_position_embeddings=8192, query_pre_attn_scalar=64,
                                         sliding_window=16, attn_logit_softcapping=50.0,
                                         final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh")
    if family.name == "gemma3":
        common["num_hidden_layers"] = 6  # five sliding-window layers, then a global one
        return transformers.Gemma3TextConfig(
            **common, max_position_embeddings=32768, query_pre_attn_scalar=64, sliding_window=16,
            rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
            architectures=["Gemma3ForCausalLM"])
    if family.name == "phi3":
        # Phi-4-mini's shape of RoPE: 3/4 of each head rotated, long-RoPE factors per rotated pair
        rotary_pairs = int(0.75 * SHAPE["head_dim"]) // 2
        common.pop("head_dim")
        return transformers.Phi3Config(
            **common, max_position_embeddings=131072, original_max_position_embeddings=4096,
            tie_word_embeddings=False, sliding_window=None,
            rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                             "long_factor": [1.0 + 0.25 * i for i in range(rotary_pairs)],
                             "short_factor": [1.0 + 0.01 * i for i in range(rotary_pairs)]})
    raise ValueError(family.name)


def _write_tokenizer(family: Family, hf_dir: Path):
    import transformers

    if family.tokenizer == "smollm2":
        source = _default_model_dir()
        for name in ("tokenizer.json",):
            shutil.copy(source / name, hf_dir / name)
        tokenizer_config = json.loads((source / "tokenizer_config.json").read_text())
        tokenizer_config["chat_template"] = CHATML_TEMPLATE
        (hf_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
        return transformers.AutoTokenizer.from_pretrained(hf_dir)
    if family.tokenizer == "qwen2":
        _write_qwen2_tokenizer(hf_dir)
        return transformers.AutoTokenizer.from_pretrained(hf_dir)
    if family.tokenizer == "gemma":
        _train_spm(hf_dir / "tokenizer.model", pad=0, eos=1, bos=2, unk=3,
                   pieces=("<pad>", "<eos>", "<bos>", "<unk>"),
                   user_defined=["<start_of_turn>", "<end_of_turn>"])
        tokenizer = transformers.GemmaTokenizer.from_pretrained(hf_dir)
        tokenizer.chat_template = GEMMA_TEMPLATE
        _save_tokenizer(tokenizer, hf_dir)
        return transformers.AutoTokenizer.from_pretrained(hf_dir)
    # Phi-3: a Llama-2-style SentencePiece model plus chat tokens after it, and its tokenizer.json's
    # pipeline (a "▁" prepended to each run of text, after special tokens too)
    from tokenizers import AddedToken, normalizers

    _train_spm(hf_dir / "tokenizer.model", pad=-1, eos=2, bos=1, unk=0, pieces=("", "</s>", "<s>", "<unk>"),
               user_defined=[])
    tokenizer = transformers.LlamaTokenizer.from_pretrained(hf_dir, legacy=True)
    tokenizer.add_special_tokens({"additional_special_tokens": [
        AddedToken(token, rstrip=token != "<|endoftext|>", normalized=False, special=True) for token in PHI3_ADDED]})
    backend = tokenizer.backend_tokenizer
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.pre_tokenizer = None
    tokenizer.pad_token = "<|endoftext|>"
    tokenizer.chat_template = PHI3_TEMPLATE
    _save_tokenizer(tokenizer, hf_dir)
    return transformers.AutoTokenizer.from_pretrained(hf_dir)


def _write_qwen2_tokenizer(hf_dir: Path) -> None:
    from gguf import GGUFReader

    from store.gguf_import import read_metadata
    from store.gguf_tokenizer import build_tokenizer

    from tests.llama_tools import llama_cpp_dir

    path = llama_cpp_dir() / "models" / "ggml-vocab-qwen2.gguf"
    metadata = read_metadata(GGUFReader(path))
    num_real = metadata["tokenizer.ggml.tokens"].index("<|im_end|>") + 1  # then llama.cpp's [PAD] fillers
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
        metadata[key] = metadata[key][:num_real]
    build_tokenizer(metadata, path).save(str(hf_dir / "tokenizer.json"))
    specials = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                         "special": True} for i, t in enumerate(metadata["tokenizer.ggml.tokens"])
                if metadata["tokenizer.ggml.token_type"][i] == 3}
    (hf_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "unk_token": None, "added_tokens_decoder": specials,
        "chat_template": CHATML_TEMPLATE, "model_max_length": 32768, "clean_up_tokenization_spaces": False}))


def _save_tokenizer(tokenizer, hf_dir: Path) -> None:
    """save_pretrained, plus tokenizer_config.json's added_tokens_decoder as the families' files on
    the Hub have it (transformers 5 leaves it out; llama.cpp's converter reads the token kinds there)."""
    tokenizer.save_pretrained(hf_dir)
    config_path = hf_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["added_tokens_decoder"] = {
        str(token_id): {"content": token.content, "lstrip": token.lstrip, "normalized": token.normalized,
                        "rstrip": token.rstrip, "single_word": token.single_word, "special": token.special}
        for token_id, token in sorted(tokenizer.added_tokens_decoder.items())}
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False))


def _train_spm(path: Path, *, pad: int, eos: int, bos: int, unk: int, pieces: tuple[str, ...],
               user_defined: list[str]) -> None:
    import sentencepiece as spm

    corpus = path.with_name("corpus.txt")
    readme = (_llama_cpp_readme()).read_text(encoding="utf-8")
    corpus.write_text(readme + "\nnaïve café déjà vu 日本語のテキスト Ελληνικά русский текст 12345 🦙\n",
                      encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(path.with_suffix("")), vocab_size=1000, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, pad_id=pad, eos_id=eos, bos_id=bos, unk_id=unk,
        pad_piece=pieces[0] or "<pad>", eos_piece=pieces[1], bos_piece=pieces[2], unk_piece=pieces[3],
        user_defined_symbols=user_defined, add_dummy_prefix=not user_defined, remove_extra_whitespaces=False,
        split_digits=True, minloglevel=2, num_threads=1)
    corpus.unlink()
    path.with_suffix(".vocab").unlink()


def _llama_cpp_readme() -> Path:
    from tests.llama_tools import llama_cpp_dir

    return llama_cpp_dir() / "README.md"


def _default_model_dir() -> Path:
    from store import model_store

    return model_store.pull(DEFAULT_MODEL, progress=False)
