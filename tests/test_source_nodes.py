"""ONNX node names from import to the per-layer report: spans through import, normalise and
partition, `op@nodes` through the runtime, one layer per kernel launch or host operator."""

from __future__ import annotations

import json
import os

import onnx
import pytest
import tvm
from hypothesis import given, strategies as st
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx as tvm_from_onnx

import npu_backend
from cgra_sim.simulate import split_source_ops
from npu_backend.tools.cli import main
from npu_backend.tools.run_model import run_onnx_model
from npu_backend.frontend.provenance import span_names
from onnx_models import mobilenet_v2, resnet

MODELS = {"resnet": resnet, "mobilenet_v2": mobilenet_v2}
EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "tiny_cnn.onnx")


@pytest.mark.parametrize("name", MODELS)
def test_import_is_tvms_with_every_call_named_after_its_node(name):
    model = MODELS[name]()
    mod = npu_backend.from_onnx(model)
    tvm.ir.assert_structural_equal(mod, tvm_from_onnx(model))  # spans are all that differ
    calls = [b.value for block in mod["main"].body.blocks for b in block.bindings
             if isinstance(b.value, relax.Call)]
    names = {node.name for node in model.graph.node}
    assert calls and all(len(span_names(call.span)) == 1 for call in calls)
    assert {span_names(call.span)[0] for call in calls} <= names


@pytest.fixture(scope="module", params=list(MODELS))
def report(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / f"{request.param}.onnx"
    model = MODELS[request.param]()
    onnx.save(model, str(path))
    return model, run_onnx_model(str(path), "cgra-8x8")


def test_every_node_is_in_exactly_one_layer(report):
    """Batch norms folded into a conv count with that conv's kernel, Clip / Relu / residual Add
    with the kernel whose epilogue took them, pooling as its own kernel; Flatten as a host layer."""
    model, report = report
    listed = [node for layer in report["layers"] for node in layer["nodes"]]
    assert sorted(listed) == sorted(node.name for node in model.graph.node)


def test_each_kernel_launch_names_its_own_layers(report):
    model, report = report
    kinds = {node.name: node.op_type for node in model.graph.node}
    launches = [layer for layer in report["layers"] if layer["where"] == "npu"]
    assert len(launches) == len(report["kernels"]) and all(layer["cycles"] > 0 for layer in launches)
    # Identical layers (MobileNetV2's repeated expansions) run kernel copies with their own names.
    assert len({layer["kernel"] for layer in launches}) == len(launches)
    for kernel in report["kernels"]:
        assert len(kernel["source_nodes"]) == len(kernel["source_ops"])
        first = kernel["source_ops"][0], kinds[kernel["source_nodes"][0]]
        # A Gemm with transB starts at the transpose its kernel reads the weight through.
        assert first in {("nn.conv2d", "Conv"), ("permute_dims", "Gemm"), ("nn.max_pool2d", "MaxPool"),
                         ("mean", "GlobalAveragePool")}
        if kernel["source_ops"][:2] == ["nn.conv2d", "add"] and "conv" in kernel["source_nodes"][0]:
            assert kinds[kernel["source_nodes"][1]] == "BatchNormalization"  # the folded bias
    host = [layer for layer in report["layers"] if layer["where"] == "host"]
    assert host and all(layer["cycles"] == 0 and layer["nodes"] for layer in host)  # a view: no host call
    assert {kinds[layer["nodes"][0]] for layer in host} == {"Flatten"}


def test_layers_follow_the_model_order(report):
    """In launch order, which is the model's: each layer ends at a later node than the one before
    (a ResNet projection shortcut runs before the block's second conv, which needs it)."""
    model, report = report
    order = {node.name: index for index, node in enumerate(model.graph.node)}
    ends = [max(order[n] for n in layer["nodes"]) for layer in report["layers"]]
    assert ends == sorted(ends) and len(set(ends)) == len(ends) and ends[-1] == len(order) - 1


def test_run_prints_the_layer_table_and_json(capsys):
    assert main(["run", EXAMPLE, "--arch", "cgra-4x4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["model", "nodes", "ops"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    # ... on (npu / host), cycles, util, DMA bytes, nJ
    assert rows["conv1,relu1"][1] == "nn.conv2d,add,nn.relu" and rows["conv1,relu1"][-5] == "npu"
    assert rows["pool"][1] == "mean" and rows["pool"][-5] == "npu"
    assert rows["flatten"][1] == "reshape" and rows["flatten"][-5:] == ["host", "0", "-", "-", "-"]  # a view
    assert rows["fc"][1] == "permute_dims,matmul,add"  # Gemm (transB): its weight read as stored
    assert main(["run", EXAMPLE, "--arch", "cgra-4x4", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [layer["nodes"] for layer in report["layers"]] == [["conv1", "relu1"], ["conv2", "relu2"],
                                                              ["pool"], ["flatten"], ["fc"]]
    assert [k["source_nodes"] for k in report["kernels"]][0] == ["conv1", "conv1", "relu1"]


def test_profile_table_shows_the_nodes():
    model = onnx.load(EXAMPLE)
    ex = npu_backend.compile(npu_backend.from_onnx(model), "cgra-4x4")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    data = tvm.runtime.tensor(__import__("numpy").zeros((1, 3, 32, 32), "float32"))
    with npu_backend.profile() as prof:
        vm["main"](data)
    assert [k.model_nodes for k in prof.kernels] == [("conv1", "relu1"), ("conv2", "relu2"), ("pool",), ("fc",)]
    assert [k.source_ops for k in prof.kernels][3] == ("permute_dims", "matmul", "add")  # Relax ops unchanged
    assert prof.table().splitlines()[1].endswith("conv1,relu1")


def test_without_names_the_kernels_stay_shared_and_unnamed():
    """TVM's own importer gives no spans: kernels report no nodes and identical layers (a
    ResNet's blocks) keep sharing one function, as before."""
    mod = tvm_from_onnx(resnet(blocks=2))
    placements = npu_backend.explain(mod, "cgra-8x8")
    kernels = [p for p in placements if p.where == "npu"]
    assert all(p.nodes == "" for p in placements)
    assert len({p.symbol for p in kernels}) < len({p.site for p in kernels})


_NAME = st.text(st.characters(blacklist_characters=",@+", blacklist_categories=("Cs",)), min_size=1,
                max_size=12).map(str.strip).filter(bool)


@given(st.lists(st.tuples(_NAME, st.lists(_NAME, max_size=3)), min_size=1, max_size=6))
def test_source_ops_string_splits_into_ops_and_nodes(entries):
    text = ",".join(f"{op}@{'+'.join(nodes)}" if nodes else op for op, nodes in entries)
    ops, nodes = split_source_ops(text)
    assert ops == tuple(op for op, _ in entries)
    assert nodes == tuple("+".join(n) for _, n in entries)
