"""A PEP 517 build backend of the standard library alone, for the atoll
package: the machines atoll is developed on reach no Python package index,
so ``pip install ./sdk/python`` cannot fetch setuptools. It builds a pure
Python wheel of the ``atoll`` package directory and an sdist of the tree.

The metadata comes from pyproject.toml's [project] table (name, version,
description, requires-python, readme), read with tomllib where Python has
it (3.11+) and with a few regular expressions otherwise.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "atoll"
TAG = "py3-none-any"


def _project() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        raw = f.read()
    try:
        import tomllib
        return tomllib.loads(raw.decode())["project"]
    except ImportError:
        text = raw.decode()
        proj = {}
        for key in ("name", "version", "description", "requires-python", "readme"):
            m = re.search(r'^%s\s*=\s*"([^"]*)"' % re.escape(key), text, re.M)
            if m:
                proj[key] = m.group(1)
        return proj


def _metadata() -> str:
    p = _project()
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}"]
    if p.get("description"):
        lines.append(f"Summary: {p['description']}")
    if p.get("requires-python"):
        lines.append(f"Requires-Python: {p['requires-python']}")
    body = ""
    if p.get("readme"):
        lines.append("Description-Content-Type: text/markdown")
        with open(os.path.join(ROOT, p["readme"]), encoding="utf-8") as f:
            body = f.read()
    return "\n".join(lines) + "\n\n" + body


def _dist_info() -> str:
    p = _project()
    return f"{p['name']}-{p['version']}.dist-info"


def _wheel_name() -> str:
    p = _project()
    return f"{p['name']}-{p['version']}-{TAG}.whl"


def _files():
    """The package's files, as (path in the wheel, path on disk)."""
    pkg = os.path.join(ROOT, PACKAGE)
    for d, dirs, files in os.walk(pkg):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for name in sorted(files):
            if name.endswith((".pyc", ".pyo")):
                continue
            full = os.path.join(d, name)
            yield os.path.relpath(full, ROOT).replace(os.sep, "/"), full


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _write_wheel(wheel_directory: str, files) -> str:
    name = _wheel_name()
    di = _dist_info()
    meta = {
        f"{di}/METADATA": _metadata().encode(),
        f"{di}/WHEEL": (f"Wheel-Version: 1.0\nGenerator: atoll-backend\nRoot-Is-Purelib: true\n"
                        f"Tag: {TAG}\n").encode(),
    }
    record = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in list(files) + list(meta.items()):
            z.writestr(arc, data)
            record.append(_record_line(arc, data))
        record.append(f"{di}/RECORD,,")
        z.writestr(f"{di}/RECORD", "\n".join(record) + "\n")
    return name


# PEP 517 hooks.

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    di = _dist_info()
    os.makedirs(os.path.join(metadata_directory, di), exist_ok=True)
    with open(os.path.join(metadata_directory, di, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata())
    return di


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = []
    for arc, full in _files():
        with open(full, "rb") as f:
            files.append((arc, f.read()))
    return _write_wheel(wheel_directory, files)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # A .pth file that puts the source tree on sys.path (PEP 660).
    return _write_wheel(wheel_directory, [(f"__editable__.{PACKAGE}.pth", (ROOT + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    p = _project()
    base = f"{p['name']}-{p['version']}"
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as tf:
        for rel in ("pyproject.toml", "README.md", "_build/backend.py"):
            tf.add(os.path.join(ROOT, rel), arcname=f"{base}/{rel}")
        for arc, full in _files():
            tf.add(full, arcname=f"{base}/{arc}")
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = _metadata().encode()
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return name
