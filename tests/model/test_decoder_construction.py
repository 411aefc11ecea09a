"""Building the model allocates its parameters uninitialised, without torch's Python meta
kernels: their import (sympy, mpmath) held 70 MiB resident in every server."""

import subprocess
import sys

SCRIPT = """
import sys
from pathlib import Path
import torch
from model.backends import select_backend
from model.config import ModelConfig
from model.decoder import DecoderForCausalLM
config = ModelConfig.from_model_dir(Path(sys.argv[1]))
backend = select_backend(torch.device("cpu"), torch.float32, config, "torch", build_dir=Path(sys.argv[2]))
model = DecoderForCausalLM(config, torch.device("cpu"), torch.float32, backend)
tensors = list(model.parameters()) + list(model.buffers())
assert not any(t.is_meta for t in tensors), "a meta tensor is left"
assert {p.dtype for p in model.parameters()} == {torch.float32}
assert model.lm_head.weight is model.embed_tokens.weight  # tied
assert tuple(model.embed_tokens.weight.shape) == (config.vocab_size, config.hidden_size)
print("sympy" in sys.modules)
"""


def test_model_is_built_without_the_meta_kernels_import(smollm2_dir, tmp_path):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(smollm2_dir), str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
