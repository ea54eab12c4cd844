"""The one content digest: what names things by their content (data and model uploads, image tags, endpoint
configs, EKS code ConfigMaps), so identical content gets the same name and changed content a new one. (The
training package's tiny-model cache has its own line of hashlib: the training code imports no toolkit module.)"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def of_value(value: Any, digits: int = 16) -> str:
    """A JSON-able value, independent of key order."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:digits]


def of_bytes(data: bytes, digits: int = 16) -> str:
    """Bytes as they are (a file's own SHA-256, as S3 and SageMaker's ContentDigest state it, at full length)."""
    return hashlib.sha256(data).hexdigest()[:digits]


def of_files(path: Path, digits: int = 16, salt: str = "") -> str:
    """A file, or a tree's files (names relative to it, then bytes; caches skipped), plus an optional salt."""
    digest = hashlib.sha256(salt.encode())
    root = path if path.is_dir() else path.parent
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        if "__pycache__" in file.parts:
            continue
        digest.update(str(file.relative_to(root)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:digits]
