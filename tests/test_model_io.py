"""Loading errors and the rules of saving a model whose weights live in external data files."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from graphs import Variant, attention_model, feeds_for

import graphfix
import graphfix.examples
from graphfix import model_io
from graphfix.errors import GraphfixError, InvalidOutputError, ModelLoadError, OutputPathError
from graphfix.model_io import load_model, save_model
from graphfix.plugins.spec import SOFTMAX


def save_external(
    model: onnx.ModelProto,
    folder: Path,
    *,
    name: str = "model.onnx",
    one_file: bool = True,
    threshold: int = 0,
) -> Path:
    """`model` saved with its initializers in external data (all of them by default)."""
    folder.mkdir(parents=True, exist_ok=True)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # onnx.save_model rewrites the model it is given
    onnx.save_model(
        copy,
        str(folder / name),
        save_as_external_data=True,
        all_tensors_to_one_file=one_file,
        location=f"{name}.data",
        size_threshold=threshold,
    )
    return folder / name


def fingerprint(path: Path) -> tuple[int, int, int, str]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns, st.st_size, hashlib.sha256(path.read_bytes()).hexdigest()


def locations(path: Path) -> set[str]:
    model = onnx.load(str(path), load_external_data=False)
    return set(model_io.external_data_files(model))


def run(model_path: Path) -> list[np.ndarray]:
    """Outputs of the saved model (plugin nodes lowered to standard ops) on fixed inputs."""
    model = graphfix.with_reference_ops(onnx.load(str(model_path)))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds_for(model))


def run_from_file(model_path: Path) -> list[np.ndarray]:
    """Outputs when onnxruntime itself reads the weights from the data file(s) on disk."""
    loaded = load_model(model_path, load_weights=False)
    lowered = model_path.with_name(f"{model_path.stem}.lowered.onnx")
    save_model(graphfix.with_reference_ops(loaded.model), lowered, source=model_path)
    session = ort.InferenceSession(str(lowered), providers=["CPUExecutionProvider"])
    return session.run(None, feeds_for(loaded.model))


def plugin_nodes(path: Path) -> int:
    model = onnx.load(str(path), load_external_data=False)
    return sum(n.op_type == SOFTMAX.op_type for n in model.graph.node)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return save_external(attention_model(Variant(mask="add")), tmp_path / "in")


def fixed(source: Path) -> onnx.ModelProto:
    return graphfix.fix_attention(source).model


# --- loading ---------------------------------------------------------------------------------


def test_load_keeps_external_references_without_reading_them(source: Path) -> None:
    loaded = load_model(source, load_weights=False)
    assert loaded.path == source and not loaded.weights_loaded
    assert model_io.external_data_files(loaded.model) == ["model.onnx.data"]
    assert all(not t.HasField("raw_data") for t in loaded.model.graph.initializer)
    full = load_model(source)
    assert all(t.HasField("raw_data") for t in full.model.graph.initializer)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda d, src: d / "absent.onnx", id="missing"),
        pytest.param(lambda d, src: d, id="directory"),
        pytest.param(
            lambda d, src: _write(d / "r.onnx", np.random.default_rng(0).bytes(4096)), id="random"
        ),
        pytest.param(lambda d, src: _write(d / "t.onnx", b"import onnx\nprint(1)\n"), id="text"),
        pytest.param(lambda d, src: _write(d / "e.onnx", b""), id="empty"),
        pytest.param(
            lambda d, src: _write(d / "cut.onnx", src.read_bytes()[: src.stat().st_size // 2]),
            id="truncated",
        ),
    ],
)
def test_unreadable_model_is_one_error_naming_the_path(tmp_path: Path, source: Path, make) -> None:
    bad = make(tmp_path, source)
    with pytest.raises(ModelLoadError, match=re.escape(str(bad))) as info:
        load_model(bad, load_weights=False)
    assert "\n" not in str(info.value)


def test_truncated_after_the_graph_is_not_a_model(tmp_path: Path) -> None:
    model = attention_model()
    del model.opset_import[:]  # what a cut right after the graph field parses to
    bad = _write(tmp_path / "cut.onnx", model.SerializeToString())
    with pytest.raises(ModelLoadError, match="not a complete ONNX model"):
        load_model(bad)


def test_missing_external_data_file(source: Path) -> None:
    (source.parent / "model.onnx.data").unlink()
    with pytest.raises(ModelLoadError, match=r"do not exist: .*in/model\.onnx\.data;"):
        load_model(source, load_weights=False)


def test_truncated_external_data_file(source: Path) -> None:
    data = source.parent / "model.onnx.data"
    data.write_bytes(data.read_bytes()[:-8])
    with pytest.raises(ModelLoadError, match=r"model\.onnx\.data is truncated"):
        load_model(source, load_weights=False)


# --- saving next to the input ----------------------------------------------------------------


def test_same_folder_references_the_data_file_untouched(source: Path) -> None:
    data = source.parent / "model.onnx.data"
    before = fingerprint(data)
    expected = run(source)
    saved = save_model(fixed(source), source.parent / "fixed.onnx", source=source)
    assert saved.weights == "referenced in place"
    assert saved.data_files == (data,)
    assert "referenced in place" in saved.describe() and "\n" not in saved.describe()
    assert fingerprint(data) == before
    assert locations(saved.path) == {"model.onnx.data"}
    assert sorted(p.name for p in source.parent.iterdir()) == [
        "fixed.onnx",
        "model.onnx",
        "model.onnx.data",
    ]
    assert plugin_nodes(saved.path) == 1
    for got, want in zip(run(saved.path), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_output_equal_to_input_is_refused_without_overwrite(source: Path) -> None:
    before = fingerprint(source)
    with pytest.raises(OutputPathError, match=r"is the input model.*--overwrite"):
        save_model(fixed(source), source, source=source)
    assert fingerprint(source) == before


def test_overwriting_the_input_never_touches_its_data_file(source: Path) -> None:
    data = source.parent / "model.onnx.data"
    before = fingerprint(data)
    expected = run(source)
    saved = save_model(fixed(source), source, source=source, overwrite=True)
    assert saved.weights == "referenced in place"
    assert fingerprint(data) == before
    assert plugin_nodes(source) == 1
    for got, want in zip(run(source), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_existing_output_is_refused_unless_overwrite(source: Path) -> None:
    out = source.parent / "fixed.onnx"
    out.write_bytes(b"the user's file")
    with pytest.raises(OutputPathError, match=r"already exists.*--overwrite"):
        save_model(fixed(source), out, source=source)
    assert out.read_bytes() == b"the user's file"
    save_model(fixed(source), out, source=source, overwrite=True)
    assert plugin_nodes(out) == 1


def test_output_onto_the_data_file_is_refused_even_with_overwrite(source: Path) -> None:
    data = source.parent / "model.onnx.data"
    before = fingerprint(data)
    with pytest.raises(OutputPathError, match="external data file"):
        save_model(fixed(source), data, source=source, overwrite=True)
    assert fingerprint(data) == before


# --- saving into another folder --------------------------------------------------------------


def test_other_folder_copies_the_data_file_byte_identical(source: Path, tmp_path: Path) -> None:
    data = source.parent / "model.onnx.data"
    before = fingerprint(data)
    expected = run(source)
    saved = save_model(fixed(source), tmp_path / "out" / "fixed.onnx", source=source)
    copy = tmp_path / "out" / "model.onnx.data"
    assert saved.weights == "copied (streaming)" and saved.data_files == (copy,)
    assert "copied (streaming)" in saved.describe()
    assert fingerprint(data) == before
    assert copy.read_bytes() == data.read_bytes()
    assert copy.stat().st_ino != data.stat().st_ino
    assert sorted(p.name for p in copy.parent.iterdir()) == ["fixed.onnx", "model.onnx.data"]
    for got, want in zip(run(saved.path), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_clone_weights_leaves_the_original_loadable(tmp_path: Path) -> None:
    # A hard link made onnx refuse the user's ORIGINAL ("multiple hard links ... hardlink
    # attack"); a copy-on-write clone is a separate inode, and where the filesystem cannot clone
    # (ext4, tmpfs) the save fails in one line and writes nothing.
    source = save_external(attention_model(Variant(mask="add")), tmp_path / "in", threshold=200)
    data = source.parent / "model.onnx.data"
    expected = run(source)
    out = tmp_path / "out"
    try:
        saved = save_model(fixed(source), out / "fixed.onnx", source=source, link_weights=True)
    except OutputPathError as exc:
        assert "copy-on-write clone" in str(exc) and "drop --clone-weights" in str(exc)
        assert not out.exists()
    else:
        clone = out / "model.onnx.data"
        assert saved.weights == "cloned (copy-on-write)" and saved.data_files == (clone,)
        assert clone.stat().st_ino != data.stat().st_ino and data.stat().st_nlink == 1
        assert clone.read_bytes() == data.read_bytes()
        load_model(saved.path)
        for got, want in zip(run_from_file(saved.path), expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert data.stat().st_nlink == 1
    load_model(source)  # the user's original still loads with its weights
    onnx.load(source)


def test_clone_uses_ficlone_and_keeps_the_source_mode(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    calls = []

    def fake_clone(fd: int, request: int, src_fd: int) -> int:  # what FICLONE does, by hand
        calls.append(request)
        os.write(fd, os.pread(src_fd, os.fstat(src_fd).st_size, 0))
        return 0

    monkeypatch.setattr(fcntl, "ioctl", fake_clone)
    data = source.parent / "model.onnx.data"
    data.chmod(0o640)
    saved = save_model(fixed(source), tmp_path / "out" / "f.onnx", source=source, link_weights=True)
    assert calls == [model_io._FICLONE]
    assert saved.weights == "cloned (copy-on-write)"
    assert "cloned (copy-on-write)" in saved.describe()
    assert (tmp_path / "out" / "model.onnx.data").stat().st_mode & 0o777 == 0o640
    load_model(saved.path)


def test_failed_copy_leaves_no_output(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(src: Path, dest: Path) -> None:
        dest.write_bytes(src.read_bytes()[:10])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(model_io, "_stream_copy", disk_full)
    out = tmp_path / "out"
    with pytest.raises(OutputPathError, match="No space left"):
        save_model(fixed(source), out / "fixed.onnx", source=source)
    assert not out.exists()  # nor the folder it created


def test_existing_different_data_file_is_refused_unless_overwrite(
    source: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    other = out / "model.onnx.data"
    other.write_bytes(b"someone else's weights")
    with pytest.raises(OutputPathError, match=r"model\.onnx\.data already exists and differs"):
        save_model(fixed(source), out / "fixed.onnx", source=source)
    assert other.read_bytes() == b"someone else's weights"
    assert not (out / "fixed.onnx").exists()
    save_model(fixed(source), out / "fixed.onnx", source=source, overwrite=True)
    assert other.read_bytes() == (source.parent / "model.onnx.data").read_bytes()


def test_identical_data_file_already_there_is_reused(source: Path, tmp_path: Path) -> None:
    first = save_model(fixed(source), tmp_path / "out" / "a.onnx", source=source)
    before = fingerprint(first.data_files[0])
    second = save_model(fixed(source), tmp_path / "out" / "b.onnx", source=source)
    assert second.weights == "referenced in place"
    assert second.data_files == first.data_files
    assert fingerprint(first.data_files[0]) == before


def test_several_data_files_are_all_placed(tmp_path: Path) -> None:
    source = save_external(attention_model(), tmp_path / "in", one_file=False)
    names = locations(source)
    assert len(names) > 3
    expected = run(source)
    same = save_model(fixed(source), source.parent / "fixed.onnx", source=source)
    other = save_model(fixed(source), tmp_path / "out" / "fixed.onnx", source=source)
    assert {p.name for p in same.data_files} == names
    assert {p.name for p in other.data_files} == names
    for name in names:
        assert (tmp_path / "out" / name).read_bytes() == (source.parent / name).read_bytes()
    for saved in (same, other):
        for got, want in zip(run(saved.path), expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# --- models with their weights in memory -----------------------------------------------------


def test_loaded_model_is_simply_saved(tmp_path: Path) -> None:
    model = attention_model()
    saved = save_model(model, tmp_path / "m.onnx")
    assert saved.weights == "embedded" and saved.data_files == ()
    assert onnx.load(str(saved.path)) == model


def test_external_references_without_source_are_refused(source: Path, tmp_path: Path) -> None:
    with pytest.raises(GraphfixError, match="pass source="):
        save_model(fixed(source), tmp_path / "m.onnx")


def test_model_over_the_protobuf_limit_spills_to_a_data_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = attention_model(Variant(mask="add"))
    source = tmp_path / "in.onnx"
    onnx.save_model(model, str(source))
    expected = run(source)
    monkeypatch.setattr(model_io, "_PROTO_LIMIT", 1500)  # stands in for 2 GB
    monkeypatch.setattr(model_io, "_EXTERNAL_THRESHOLD", 500)
    saved = save_model(model, tmp_path / "out" / "m.onnx")
    assert saved.weights == "written as external data"
    assert saved.data_files == (tmp_path / "out" / "m.onnx.data",)
    assert saved.path.stat().st_size < 1500 and saved.data_bytes == 4 * 12 * 12 * 4  # Wq Wk Wv Wo
    assert all(t.HasField("raw_data") for t in model.graph.initializer)  # caller's model intact
    for got, want in zip(run(saved.path), expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_missing_output_folders_are_created_and_reported(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "new" / "deeper" / "fixed.onnx"
    saved = save_model(fixed(source), out, source=source)
    assert saved.created_folders == (tmp_path / "new", tmp_path / "new" / "deeper")
    assert saved.describe().startswith(
        f"created the folders {tmp_path / 'new'}, {tmp_path / 'new' / 'deeper'}; saved {out}"
    )
    again = save_model(fixed(source), out.with_name("again.onnx"), source=source)
    assert again.created_folders == () and again.describe().startswith("saved ")


_SLOW_SAVE = """
import signal, sys, time
from pathlib import Path
import onnx
from graphfix import model_io

# A shell that starts a job in the background makes it ignore SIGINT, and Python then keeps
# ignoring it: restore what an interactive Ctrl-C delivers.
signal.signal(signal.SIGINT, signal.default_int_handler)

def slow_copy(source, dest):  # stage a part of the copy, then stall inside the write
    dest.write_bytes(source.read_bytes()[:100])
    print("writing", flush=True)
    time.sleep(60)

model_io._stream_copy = slow_copy
source = Path(sys.argv[1])
model = onnx.load(source, load_external_data=False)
model_io.save_model(model, Path(sys.argv[2]), source=source)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_a_write_leaves_no_temporary_file(
    source: Path, tmp_path: Path, signum: int
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    child = subprocess.Popen(
        [sys.executable, "-c", _SLOW_SAVE, str(source), str(out / "fixed.onnx")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert child.stdout.readline() == "writing\n", child.stderr.read()
        assert [p.name for p in out.iterdir() if p.name.endswith(".graphfix-tmp")]
        child.send_signal(signum)
        child.wait(timeout=30)
    finally:
        child.kill()
    assert child.returncode != 0
    assert list(out.iterdir()) == []  # neither the temporary data file nor a half model


def test_a_model_failing_the_checker_is_not_written(tmp_path: Path) -> None:
    """What graphfix writes passes onnx.checker: a model whose node reads a tensor nothing
    defines is refused before any file is made (exit code 1, the check failed)."""
    model = graphfix.examples.vit_example(blocks=1, width=32, heads=2)
    model.graph.node[1].input[0] = "nowhere"
    out = tmp_path / "sub" / "m.onnx"
    with pytest.raises(InvalidOutputError, match="fails onnx.checker .*nowhere"):
        save_model(model, out)
    assert not out.parent.exists()
    assert InvalidOutputError.exit_code == 1
