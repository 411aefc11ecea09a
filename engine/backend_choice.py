"""The execution backend an EngineConfig asks for: its backend settings handed to model.backends'
select_backend in one place, so a new backend knob is one line here, not in the engine's constructor."""

from pathlib import Path

import torch

from engine.engine_config import EngineConfig
from kernels.kv_format import kv_dtype_name
from model.backends import check_kv_dtypes, select_backend
from model.config import ModelConfig
from store.model_store import radixserve_home


def backend_for(config: EngineConfig, device: torch.device, dtype: torch.dtype, model_dir: Path):
    """The backend that runs this config's model on `device` in `dtype` (kernels built under
    $RADIXSERVE_HOME/kernels). Raises ValueError when that backend cannot hold the config's KV formats
    (before anything is built)."""
    check_kv_dtypes(config.backend, device, dtype, *config.kv_dtype.resolve(kv_dtype_name(dtype)))
    return select_backend(device, dtype, ModelConfig.from_model_dir(model_dir), config.backend,
                          build_dir=radixserve_home() / "kernels", crossover=config.few_rows_crossover,
                          cpu_kernels=config.cpu_kernels, int8_activations=config.int8_activations,
                          decode_activations=config.decode_activations,
                          float_prefill_max_bytes=config.float_prefill_max_bytes,
                          prefill_dtype=config.prefill_dtype, prefill_attention=config.prefill_attention)
