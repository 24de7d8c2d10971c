"""A torch dynamo export with external data in, variants out that read only their own files (issue 11.1).

The dynamo exporter keeps even small tensors (a 512-byte bias) in ``model.onnx.data``; a variant once
serialised them as references to that file, relative to the variant's folder.
"""

from __future__ import annotations

import onnx
import pytest

from onnxsmith.io.check import tensors
from tests.conftest import run_cli_in_process


def _locations(path) -> set[str]:
    proto = onnx.load(path, load_external_data=False)
    found = set()
    for tensor in tensors(proto):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            found.update(e.value for e in tensor.external_data if e.key == "location")
    return found


@pytest.fixture(scope="module")
def dynamo_export(tmp_path_factory):
    torch = pytest.importorskip("torch")

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
            self.head = torch.nn.Linear(64, 10)

        def forward(self, x):
            return self.head(self.layer(x))

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("dynamo") / "model.onnx"
    torch.onnx.export(Encoder().eval(), (torch.randn(2, 8, 64),), path, dynamo=True, external_data=True)
    small = [
        t.name
        for t in onnx.load(path, load_external_data=False).graph.initializer
        if t.data_location == onnx.TensorProto.EXTERNAL
        and int({e.key: e.value for e in t.external_data}["length"]) < 4096
    ]
    assert small, "the export should keep small tensors in its data file (what made variants point at it)"
    return path


@pytest.mark.parametrize("command", ["fp16", "fuse", "shrink"])
def test_a_variant_elsewhere_reads_no_file_of_the_source(dynamo_export, tmp_path, command):
    out = tmp_path / "elsewhere" / "variant.onnx"
    result = run_cli_in_process(command, dynamo_export, out, "--samples", "1")
    assert result.returncode == 0, result.stderr
    assert _locations(out) == set()
    assert run_cli_in_process("inspect", out).returncode == 0


def test_a_variant_beside_the_source_reads_no_file_of_the_source(dynamo_export, tmp_path):
    """Beside the source the stale references would resolve, silently tying the variant to the source's data."""
    out = dynamo_export.with_name("shrunk.onnx")
    try:
        assert run_cli_in_process("shrink", dynamo_export, out, "--samples", "1").returncode == 0
        assert _locations(out) == set()
    finally:
        out.unlink(missing_ok=True)


def test_an_external_variant_reads_only_its_own_data_file(dynamo_export, tmp_path):
    out = tmp_path / "ext" / "variant.onnx"
    result = run_cli_in_process("shrink", dynamo_export, out, "--external-data", "--samples", "1")
    assert result.returncode == 0, result.stderr
    assert _locations(out) == {"variant.onnx.data"}
    (tmp_path / "moved").mkdir()  # the pair works wherever it goes, without the source beside it
    for name in ("variant.onnx", "variant.onnx.data"):
        (out.parent / name).rename(tmp_path / "moved" / name)
    assert run_cli_in_process("compare", dynamo_export, tmp_path / "moved" / "variant.onnx").returncode == 0
