"""The model's shape, read from an HF-style `config.json`."""

import json
from dataclasses import dataclass
from pathlib import Path

from store.errors import ModelFormatError

# Architectures the one Llama-family implementation covers. Qwen2 differs only by
# q/k/v biases; Mistral and SmolLM are Llama with other sizes.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    has_qkv_bias: bool
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_attention_heads {self.num_heads} is not a multiple of "
                f"num_key_value_heads {self.num_kv_heads}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json") -> "ModelConfig":
        architectures = raw.get("architectures") or []
        architecture = next((a for a in architectures if a in SUPPORTED_ARCHITECTURES), None)
        if architecture is None:
            raise ModelFormatError(
                source,
                f"unsupported architecture {architectures or raw.get('model_type')!r}; "
                f"supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}",
            )
        try:
            num_heads = int(raw["num_attention_heads"])
            hidden_size = int(raw["hidden_size"])
            eos = raw.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
            model_type = SUPPORTED_ARCHITECTURES[architecture]
            # transformers 5 writes `rope_parameters` (theta included); 4.x writes
            # `rope_theta` and `rope_scaling`.
            rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
            rope_theta = float(rope.pop("rope_theta", raw.get("rope_theta", 10000.0)))
            if rope.get("rope_type", rope.get("type", "default")) == "default":
                rope = {}
            return cls(
                architecture=architecture,
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden_size,
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=num_heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
                head_dim=int(raw.get("head_dim") or hidden_size // num_heads),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=rope_theta,
                rope_scaling=rope or None,
                max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                has_qkv_bias=bool(raw.get("attention_bias", model_type == "qwen2")),
                bos_token_id=raw.get("bos_token_id"),
                eos_token_ids=eos_ids,
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ModelFormatError(source, f"bad model config: {error!r}") from None

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> "ModelConfig":
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ModelFormatError(path, "missing (not a model directory)")
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ModelFormatError(path, f"unreadable: {error}") from None
        return cls.from_dict(raw, source=str(path))
