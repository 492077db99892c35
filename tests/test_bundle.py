"""The bundle format (hyflash.bundle): every manifest field is checked and a problem names
the field; an edited manifest is caught by its own hash; format 1 manifests are still
read; a newer format is refused; the graphs' real I/O must match the recorded contract;
and the runtime reads bundles without importing the exporter."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from hyflash.bundle import FORMAT_VERSION, MANIFEST, file_table, parse_manifest, read_bundle, seal
from hyflash.errors import HyflashError
from hyflash.runtime import SpeculativeEngine
from hyflash.runtime.onnx_backend import load_onnx_pair

DATA = Path(__file__).parent / "data"


def raw(bundle: Path) -> dict:
    return json.loads((bundle / MANIFEST).read_text())


def copy(bundle: Path, tmp_path: Path, data: dict | None = None, reseal: bool = True) -> Path:
    """A copy of bundle, with manifest data (files re-hashed, sealed) if given."""
    out = tmp_path / f"copy-{bundle.name}"
    shutil.copytree(bundle, out)
    if data is not None:
        data = {**data, "files": {n: e.to_dict() for n, e in file_table(out).items()}}
        (out / MANIFEST).write_text(json.dumps(seal(data) if reseal else data))
    return out


def tokens(bundle: Path, prompt=(5, 6, 7, 8, 9, 10, 11, 12)) -> list[int]:
    _, target, drafter = load_onnx_pair(bundle, threads=1)
    return SpeculativeEngine(target, drafter).generate(list(prompt), max_new_tokens=24).tokens


# ------------------------------------------------------------- every field

def delete(*keys):
    def edit(m):
        for k in keys[:-1]:
            m = m[k]
        del m[keys[-1]]
    return edit


def put(value, *keys):
    def edit(m):
        for k in keys[:-1]:
            m = m[k]
        m[keys[-1]] = value
    return edit


DAMAGE = {
    "shape missing": (delete("models", "target", "inputs", 3, "shape"),
                      "models.target.inputs[3].shape is missing"),
    "unknown dtype": (put("float128", "models", "target", "inputs", 0, "dtype"),
                      "models.target.inputs[0].dtype is 'float128'"),
    "block size a string": (put("8", "drafter", "config", "block_size"),
                            "drafter.config.block_size must be an integer, got a string"),
    "block size 0": (put(0, "drafter", "config", "block_size"),
                     "drafter.config.block_size is 0: must be >= 1"),
    "negative max_seq_len": (put(-1, "target", "config", "max_seq_len"),
                             "target.config.max_seq_len is -1"),
    "tap layer out of range": (put([0, 99], "target", "config", "tap_layers"),
                               "target.config is not valid (tap layers [99] out of range"),
    "eps not finite": (put(float("nan"), "target", "config", "rms_norm_eps"),
                       "target.config.rms_norm_eps is nan"),
    "state shape not a list": (put("big", "drafter", "state", 1, "shape"),
                               "drafter.state[1].shape must be a list, got a string"),
    "unknown window cache": (put("ring", "drafter", "window_cache"),
                             "drafter.window_cache is 'ring': must be one of kv, features"),
    "bad file hash": (put("xyz", "files", "model.onnx", "sha256"),
                      "files.model.onnx.sha256 must be 64 lowercase hex digits"),
    "file size missing": (delete("files", "model.onnx", "bytes"),
                          "files.model.onnx.bytes is missing"),
    "commit rows 0": (put(0, "models", "drafter_step", "commit_rows"),
                      "models.drafter_step.commit_rows is 0"),
    "models a list": (put([], "models"), "models must be a JSON object, got a list"),
    "target null": (put(None, "target"), "target must be a JSON object, got null"),
    "graph role missing": (delete("models", "drafter_commit"), "models.drafter_commit is missing"),
    "graph input renamed": (put("positions", "models", "target", "inputs", 2, "name"),
                            "models.target.inputs lack 'position_ids'"),
    "state shape disagrees": (put([1, 99, 32], "models", "drafter_step", "inputs", 3, "shape"),
                              "models.drafter_step.inputs[3] is [1, 99, 32] float32, but "
                              "drafter.state records window_k as [1, 16, 32]"),
    "kv pattern without layer": (put("past.{kind}", "kv_cache", "past_inputs"),
                                 "kv_cache.past_inputs is 'past.{kind}'"),
    "file outside the bundle": (put(["../../etc/passwd"], "tokenizer", "files"),
                                "tokenizer.files[0] is '../../etc/passwd': must be a path "
                                "inside the bundle"),
    "graph details not an object": (put("int4", "quantization", "graphs", "target"),
                                    "quantization.graphs.target must be a JSON object"),
    "a format 1 copy left over": (put(8, "block_size"),
                                  "block_size is not a field of this manifest format"),
}


@pytest.mark.parametrize("case", DAMAGE)
def test_a_damaged_field_is_named_in_one_line(onnx_bundles, case):
    """Sealed after the damage (as a buggy writer would), so the field checks, not the
    hash, must catch it."""
    edit, field = DAMAGE[case]
    data = raw(onnx_bundles[2]["hyflash"])
    edit(data)
    with pytest.raises(HyflashError) as e:  # never a KeyError or TypeError
        parse_manifest(seal(data), "bundle/manifest.json")
    msg = str(e.value)
    assert msg.startswith("bundle/manifest.json: ") and "\n" not in msg, msg
    assert field in msg and "the manifest is damaged" in msg and "hyflash export" in msg, msg


def test_the_writer_writes_exactly_what_the_reader_reads(onnx_bundles):
    """Canonical round trip: records -> dict -> hash is stable, so an untouched manifest
    never reads as edited."""
    for bundle in onnx_bundles[2].values():
        m = read_bundle(bundle).manifest
        assert seal(m.to_dict()) == raw(bundle)


def test_an_unknown_backend_asks_for_a_newer_hyflash(onnx_bundles, tmp_path):
    data = raw(onnx_bundles[2]["hyflash"])
    data["backend"] = "tflite"
    with pytest.raises(HyflashError, match="backend 'tflite', which this hyflash does not know"):
        parse_manifest(seal(data))


# --------------------------------------------------------------- the hash

@pytest.mark.parametrize("edit", [put(8, "drafter", "config", "block_size"),
                                  put(99999, "target", "config", "max_seq_len"),
                                  put(2, "models", "drafter_step", "commit_rows")])
def test_an_edited_manifest_is_reported_as_edited(onnx_bundles, tmp_path, edit):
    data = raw(onnx_bundles[2]["hyflash"])
    edit(data)
    bundle = copy(onnx_bundles[2]["hyflash"], tmp_path)
    (bundle / MANIFEST).write_text(json.dumps(data, indent=1))
    with pytest.raises(HyflashError, match=r"manifest.json was edited after export \(its "
                                           r"content hash does not match\): re-export"):
        read_bundle(bundle)


def test_a_manifest_without_its_hash_is_damaged(onnx_bundles):
    data = raw(onnx_bundles[2]["hyflash"])
    del data["manifest_sha256"]
    with pytest.raises(HyflashError, match="manifest_sha256 is missing: the manifest is damaged"):
        parse_manifest(data)


# ------------------------------------------------------------- versions

@pytest.mark.parametrize("fixture,source,cache", [
    ("manifest_v1_kv.json", "hyflash", "kv"),
    ("manifest_v1_before_window_cache.json", "hyflash-features", "features"),
])
def test_format_1_bundles_are_read_and_run(onnx_bundles, tmp_path, fixture, source, cache):
    """Manifests written by hyflash before format 2 (the second one from before
    window_cache existed: its window holds fused features), over the same graphs."""
    v1 = json.loads((DATA / fixture).read_text())
    assert "window_cache" in v1 or cache == "features"
    bundle = copy(onnx_bundles[2][source], tmp_path, v1, reseal=False)
    m = read_bundle(bundle).manifest
    assert m.format_version == 1 and m.drafter.window_cache == cache
    assert (m.block_size, m.window, m.tap_layers, m.max_context) == (4, 16, (0, 1, 2), 128)
    assert m.quantization.graphs["target"] == {"weights": "float32"}
    assert m.state_bytes == v1["state_bytes"]
    assert m.kv_bytes_per_token == v1["kv_cache"]["bytes_per_token"]
    assert tokens(bundle) == tokens(onnx_bundles[2][source])


def test_a_manifest_from_before_draft_vocabularies_reads_as_the_full_vocabulary(onnx_bundles,
                                                                                 tmp_path):
    data = raw(onnx_bundles[2]["hyflash"])
    del data["drafter"]["config"]["draft_vocab"]
    bundle = copy(onnx_bundles[2]["hyflash"], tmp_path, data)
    assert read_bundle(bundle).manifest.drafter.config.draft_vocab == 0
    assert tokens(bundle) == tokens(onnx_bundles[2]["hyflash"])


def test_format_1_copies_that_disagree_are_an_edit(tmp_path):
    v1 = json.loads((DATA / "manifest_v1_kv.json").read_text())
    v1["block_size"] = 8
    with pytest.raises(HyflashError, match="block_size is 8 but drafter.config.block_size is 4"):
        parse_manifest(v1)


def test_a_newer_format_is_refused(onnx_bundles):
    data = raw(onnx_bundles[2]["hyflash"])
    data["format_version"] = FORMAT_VERSION + 1
    with pytest.raises(HyflashError, match=f"format version {FORMAT_VERSION + 1}, newer than "
                                           f"this hyflash supports \\({FORMAT_VERSION}\\): "
                                           "upgrade hyflash"):
        parse_manifest(data)


# ------------------------------------------------ real graphs vs the contract

def rename_graph_input(path: Path, old: str, new: str) -> None:
    model = onnx.load(str(path))
    for v in model.graph.input:
        if v.name == old:
            v.name = new
    for node in model.graph.node:
        node.input[:] = [new if i == old else i for i in node.input]
    onnx.save(model, str(path))


def test_a_graph_whose_io_differs_from_its_contract_is_refused(onnx_bundles, tmp_path):
    """The files and the manifest are consistent (re-hashed, re-sealed), but model.onnx
    is not the graph the contract describes."""
    bundle = copy(onnx_bundles[2]["hyflash"], tmp_path)
    rename_graph_input(bundle / "model.onnx", "input_ids", "tokens")
    onnx.checker.check_model(str(bundle / "model.onnx"))
    bundle = copy(bundle, tmp_path, raw(bundle))
    read_bundle(bundle)  # the manifest itself is fine
    with pytest.raises(HyflashError, match="model.onnx does not match manifest.json: it has "
                                           "no input 'input_ids'"):
        load_onnx_pair(bundle, threads=1)


@pytest.mark.parametrize("edit,needle", [
    (put("int32", "models", "drafter_step", "inputs", 0, "dtype"),
     "input 'anchor' is int64, the manifest records int32"),
    (put([4], "models", "drafter_step", "inputs", 1, "shape"),
     "input 'features' has shape [4, 96], the manifest records [4]"),
    (put([3, 50], "models", "drafter_step", "outputs", 0, "shape"),
     "output 'logits' has shape [3, 48], the manifest records [3, 50]"),
])
def test_a_contract_whose_dtype_or_shape_differs_from_the_graph_is_refused(
        onnx_bundles, tmp_path, edit, needle):
    data = raw(onnx_bundles[2]["hyflash"])
    edit(data)
    bundle = copy(onnx_bundles[2]["hyflash"], tmp_path, data)
    with pytest.raises(HyflashError, match=r"drafter.onnx does not match manifest.json: "
                                           + needle.replace("[", r"\[").replace("]", r"\]")):
        load_onnx_pair(bundle, threads=1)


# --------------------------------------------------------------- layering

def test_runtime_and_bundle_do_not_import_the_exporter(onnx_bundles):
    """A phone does not export: opening and running a bundle loads no hyflash.export
    module, and the format module loads neither export nor runtime."""
    code = (
        "import sys\n"
        "import hyflash.bundle, hyflash.bundle.describe\n"
        "bad = [m for m in sys.modules if m.startswith(('hyflash.export', 'hyflash.runtime'))]\n"
        "assert not bad, bad\n"
        "import hyflash.runtime.onnx_backend as ob, hyflash.simulate.command\n"
        "import hyflash.simulate.report, hyflash.runtime.command\n"
        "from hyflash.runtime import SpeculativeEngine\n"
        f"_, t, d = ob.load_onnx_pair({str(onnx_bundles[2]['hyflash'])!r}, threads=1)\n"
        "SpeculativeEngine(t, d).generate([5, 6, 7], max_new_tokens=8)\n"
        "bad = [m for m in sys.modules if m.startswith('hyflash.export')]\n"
        "assert not bad, bad\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).parent.parent)
    assert run.returncode == 0, run.stderr[-2000:]
