"""The frames messages travel in (hwplace.runtime.messaging.communicator's encode and decode, no Ray): every tensor
arrives as it left, whichever path its bytes take."""

from __future__ import annotations

from typing import Any

import pytest

from hwplace.runtime.messaging.communicator import PICKLED, TENSOR, decode, encode

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(("make", "kind"), [
    (lambda: torch.arange(6.0).reshape(2, 3), TENSOR),
    (lambda: torch.tensor([1 + 2j, 3 - 1j]).conj(), TENSOR),  # a conjugate view: its values go
    (lambda: torch.tensor([1 + 2j]).conj().imag, TENSOR),  # a negative view
    (lambda: torch.eye(3).to_sparse(), PICKLED),
    (lambda: torch.eye(3).to_sparse_csr(), PICKLED),
    (lambda: torch.empty(2, 3, device="meta"), PICKLED),
    (lambda: torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8), PICKLED),
], ids=["dense", "conj", "neg", "sparse", "csr", "meta", "quantized"])
def test_a_tensor_arrives_as_it_left(make: Any, kind: int) -> None:
    sent = make()
    header, payload = encode(sent, device_ok=False)
    assert int(header[0]) == kind
    got = decode(header, payload)
    assert (got.layout, got.device.type, got.dtype, tuple(got.shape)) == (sent.layout, sent.device.type, sent.dtype,
                                                                         tuple(sent.shape))
    if sent.is_meta:
        return
    if sent.is_quantized:
        assert (got.q_scale(), got.int_repr().tolist()) == (sent.q_scale(), sent.int_repr().tolist())
    else:
        assert torch.equal(got.to_dense() if got.layout != torch.strided else got,
                           sent.to_dense() if sent.layout != torch.strided else sent.resolve_conj().resolve_neg())
