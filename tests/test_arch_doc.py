"""The hardware description's reference page and JSON Schema are generated from the class
(cgra_sim/arch_doc.py): the committed files must be what it writes, the schema must accept every
preset and the worked example and refuse what the loader refuses."""

from __future__ import annotations

import dataclasses
import json
import os

import jsonschema
import pytest

from cgra_sim import arch_doc
from cgra_sim.host import default_host
from cgra_sim.arch import FIELD_DOCS, ArchError, HardwareDescription, load_arch, preset_names

ROOT = os.path.join(os.path.dirname(__file__), "..")
DOCS = os.path.join(ROOT, "docs")
EXAMPLE = os.path.join(ROOT, "examples", "my_chip.json")


def _read(path) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def test_the_committed_reference_and_schema_are_what_the_class_generates():
    """If this fails, run `python -m cgra_sim.arch_doc --write docs` and commit the result."""
    assert _read(os.path.join(DOCS, arch_doc.MARKDOWN_FILE)) == arch_doc.markdown()
    assert _read(os.path.join(DOCS, arch_doc.SCHEMA_FILE)) == arch_doc.schema_text()


def test_every_field_is_documented():
    assert [f.name for f in dataclasses.fields(HardwareDescription)] == list(FIELD_DOCS)


@pytest.fixture(scope="module")
def validator():
    schema = json.loads(_read(os.path.join(DOCS, arch_doc.SCHEMA_FILE)))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_presets_and_the_worked_example_validate_and_load(validator):
    for name in preset_names():
        validator.validate(json.loads(load_arch(name).to_json()))
    example = json.loads(_read(EXAMPLE))
    validator.validate(example)
    arch = load_arch(EXAMPLE)
    assert arch.name == example["name"] and arch.energy["mac"] == {"float32": 4.6, "int8": 0.3}
    assert arch.host_cpu["clock_mhz"] == 1200.0 and load_arch("cgra-8x8").host_cpu == default_host()


def test_a_description_without_a_host_table_keeps_its_json():
    """The host table is left out of the JSON (and so of the fingerprint, the kernel cache keys and
    the compiled code) when the description does not set it: the presets' stay what they were."""
    arch = load_arch("cgra-8x8")
    assert "host" not in json.loads(arch.to_json()) and arch.host is None
    with_host = HardwareDescription.from_dict({**arch.to_dict(), "host": default_host()})
    assert with_host.host_cpu == arch.host_cpu and with_host.fingerprint != arch.fingerprint
    assert HardwareDescription.from_json(with_host.to_json()) == with_host


def test_a_model_runs_on_the_worked_example():
    import npu_backend
    from npu_backend.tools.workloads import matmul_model, run

    mod, inputs, ref = matmul_model(50, 40, 70, "int8")
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, EXAMPLE), inputs)
    assert (out == ref).all() and prof.kernels[0].arch == "edge-12x12"


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(rows=0), "'rows' must be a positive integer"),
    (lambda d: d.update(colour="red"), "unknown keys ['colour']"),
    (lambda d: d.pop("dma_latency"), "missing keys ['dma_latency']"),
    (lambda d: d["macs_per_pe"].update(int32=1), "macs_per_pe names 'int32'"),
    (lambda d: d.update(energy={"mac": {"int8": 0.3, "float32": 4.6}}), "'energy' must have the keys"),
    (lambda d: d.update(clock_mhz=0), "'clock_mhz' must be a positive number"),
    (lambda d: d.update(dma_bytes_per_cycle=1 << 17), "'dma_bytes_per_cycle' is 131072, more than"),
    (lambda d: d["host"].update(ops_per_cycle=0), "host['ops_per_cycle'] must be a positive number"),
    (lambda d: d["host"].pop("clock_mhz"), "'host' must have the keys"),
])
def test_the_schema_refuses_what_the_loader_refuses(validator, change, message):
    data = json.loads(_read(EXAMPLE))
    change(data)
    assert not validator.is_valid(data)
    with pytest.raises(ArchError, match=message.replace("[", r"\[").replace("]", r"\]")):
        HardwareDescription.from_dict(data)
