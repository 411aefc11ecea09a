"""A BERT encoder in plain torch (what all-MiniLM-L6-v2 is), loaded from an HF safetensors file.

Only the parts an embedding needs: embeddings (word + position + token type, LayerNorm),
post-LayerNorm encoder layers with exact GELU; no pooler, no dropout (inference only).
Parameter names follow HF's `BertModel` so its safetensors load as they are.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden size {self.hidden_size} is not a multiple of {self.num_attention_heads} heads")

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> "BertConfig":
        raw = json.loads((Path(model_dir) / "config.json").read_text())
        if raw.get("hidden_act", "gelu") != "gelu" or raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("only BERT with exact GELU and absolute positions is supported")
        return cls(**{name: raw[name] for name in cls.__dataclass_fields__})


class _Embeddings(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(x + self.position_embeddings(positions))  # (B, T, H)


class _Layer(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.num_heads = c.num_attention_heads
        h = c.hidden_size
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.attention_dense = nn.Linear(h, h)
        self.attention_norm = nn.LayerNorm(h, eps=c.layer_norm_eps)
        self.intermediate = nn.Linear(h, c.intermediate_size)
        self.output_dense = nn.Linear(c.intermediate_size, h)
        self.output_norm = nn.LayerNorm(h, eps=c.layer_norm_eps)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        B, T, H = x.shape
        nh = self.num_heads

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(B, T, nh, H // nh).transpose(1, 2)  # (B, nh, T, hs)

        attended = F.scaled_dot_product_attention(heads(self.query(x)), heads(self.key(x)), heads(self.value(x)),
                                                  attn_mask=key_mask)  # (B, nh, T, hs)
        attended = attended.transpose(1, 2).reshape(B, T, H)
        x = self.attention_norm(x + self.attention_dense(attended))
        return self.output_norm(x + self.output_dense(F.gelu(self.intermediate(x))))


# Our parameter names -> HF BertModel's, per layer (the rest match as they are).
_HF_LAYER_NAMES = {
    "query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
    "attention_dense": "attention.output.dense", "attention_norm": "attention.output.LayerNorm",
    "intermediate": "intermediate.dense", "output_dense": "output.dense", "output_norm": "output.LayerNorm",
}


class BertEncoder(nn.Module):
    """input ids (B, T) + attention mask (B, T) -> last hidden states (B, T, H)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = _Embeddings(config)
        self.layers = nn.ModuleList(_Layer(config) for _ in range(config.num_hidden_layers))

    @classmethod
    def from_model_dir(cls, model_dir: Path, device: str | torch.device = "cpu") -> "BertEncoder":
        config = BertConfig.from_model_dir(model_dir)
        with torch.device("meta"):
            model = cls(config)
        hf = load_file(str(Path(model_dir) / "model.safetensors"), device=str(device))
        hf = {name.removeprefix("bert."): tensor for name, tensor in hf.items()}
        state = {}
        for name in model.state_dict():
            if name.startswith("layers."):
                _, index, module, param = name.split(".")
                state[name] = hf[f"encoder.layer.{index}.{_HF_LAYER_NAMES[module]}.{param}"]
            else:
                state[name] = hf[name]
        model.load_state_dict(state, assign=True)
        return model.eval()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        key_mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T): padding keys are never attended
        x = self.embeddings(input_ids, token_type_ids)
        for layer in self.layers:
            x = layer(x, key_mask)
        return x
