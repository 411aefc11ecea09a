"""Every family's decode steps record and replay (model/backends/decode_programs.py) on GGUF files made by
llama.cpp's tools, with the tokens the layers give run as usual: q/k norms (Qwen3, Gemma 3) and q/k/v biases
(Qwen2) run as C kernels too. Marked llama_tools (make test-llama)."""

import pytest

from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.speculation_config import SpeculationConfig
from tests.llama_made_models import FAMILIES, imported_dir, made_model
from tests.llama_tools import require_llama_tools

pytestmark = [pytest.mark.llama_tools, pytest.mark.model]


@pytest.mark.parametrize("gguf_type", ["Q8_0", "Q4_K_M"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_replays_its_decode_steps_with_the_usual_tokens(family, gguf_type):
    model_dir = imported_dir(made_model(require_llama_tools(), family), family, gguf_type)
    engine = LLMEngine(EngineConfig(model_dir=model_dir, device="cpu", dtype="float32", backend="cpu",
                                    kv_cache_bytes=32 << 20, enable_prefix_cache=False,
                                    speculation=SpeculationConfig(mode="off")))
    programs = engine.backend.decode_programs
    if programs is None:
        pytest.skip("the fused C decode kernels are not built here")
    prompts, params = [list(range(5, 25)), list(range(30, 41))], SamplingParams(max_tokens=12, temperature=0,
                                                                             ignore_eos=True)
    replayed = engine.generate(prompts, params)
    assert not programs.not_replayed and programs.replays == 10  # 11 decode steps of 2: one recorded
    engine.backend.decode_programs = None
    assert replayed == engine.generate(prompts, params)
