"""DocumentReuseConfig (EngineConfig.documents): defaults, and every bad value refused in __post_init__."""

from pathlib import Path

import pytest

from engine.document_reuse_config import DocumentReuseConfig
from engine.engine_config import EngineConfig
from engine.metrics import EngineStats
from engine.request import RequestOutput


def test_document_reuse_is_off_by_default():
    documents = EngineConfig(model_dir=Path("m")).documents
    assert documents.enabled is False
    assert documents.store_bytes > 0 and documents.boundary_tokens >= 0 and documents.disk_bytes > 0
    assert documents.recompute_fraction == 0.0 and documents.min_span_tokens == 64


@pytest.mark.parametrize("field, value", [
    ("store_bytes", 0), ("boundary_tokens", -1), ("recompute_fraction", -0.1), ("recompute_fraction", 1.5),
    ("min_span_tokens", 0), ("disk_bytes", 0),
])
def test_bad_document_settings_are_refused(field, value):
    with pytest.raises(ValueError, match="document " + field.replace("_", " ")):
        DocumentReuseConfig(**{field: value})


def test_new_counters_default_to_zero():
    stats = EngineStats(*([0] * 10))
    assert (stats.documents.num_reused_spans, stats.documents.num_reused_tokens, stats.documents.num_recomputed_tokens,
            stats.documents.num_store_bytes, stats.documents.num_store_entries,
            stats.documents.num_selective_recomputed_tokens, stats.documents.num_probe_tokens) == (0,) * 7
    output = RequestOutput("r", [1], None, None, None, 3, 0, 1)
    assert output.num_reused_document_tokens == 0
