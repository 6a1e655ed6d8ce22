"""A PEP 517 build backend for the convd package, in pure Python with no requirements, so that
`pip install ./python` needs nothing from a package index.

The package is pure Python (convd/*.py), so a wheel is a zip of those files and a dist-info
folder (METADATA, WHEEL, RECORD). The metadata comes from pyproject.toml's [project] table.
build_editable writes a wheel holding one .pth file that puts this folder on sys.path.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import tarfile
import zipfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
TAG = "py3-none-any"


def _project() -> dict:
    path = os.path.join(HERE, "pyproject.toml")
    try:
        import tomllib
    except ImportError:  # Python < 3.11: the few flat keys this backend reads.
        text = open(path, encoding="utf-8").read()
        section = text.split("[project]", 1)[1].split("\n[", 1)[0]

        def key(name):
            m = re.search(rf'^{name}\s*=\s*"([^"]*)"', section, re.M)
            return m.group(1) if m else None

        deps = re.search(r"^dependencies\s*=\s*\[([^\]]*)\]", section, re.M)
        return {
            "name": key("name"),
            "version": key("version"),
            "description": key("description") or "",
            "requires-python": key("requires-python"),
            "dependencies": re.findall(r'"([^"]+)"', deps.group(1)) if deps else [],
            "optional-dependencies": {"torch": ["torch"]},
        }
    with open(path, "rb") as f:
        return tomllib.load(f)["project"]


def _names():
    p = _project()
    return p, p["name"], p["version"]


def _metadata() -> str:
    p, name, version = _names()
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        f"Summary: {p.get('description', '')}",
    ]
    if p.get("requires-python"):
        lines.append(f"Requires-Python: {p['requires-python']}")
    for dep in p.get("dependencies", []):
        lines.append(f"Requires-Dist: {dep}")
    for extra, deps in p.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        for dep in deps:
            lines.append(f'Requires-Dist: {dep} ; extra == "{extra}"')
    readme = os.path.join(HERE, "README.md")
    body = ""
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        body = "\n" + open(readme, encoding="utf-8").read()
    return "\n".join(lines) + "\n" + body


def _wheel_file() -> str:
    return "Wheel-Version: 1.0\nGenerator: convd_build\nRoot-Is-Purelib: true\nTag: " + TAG + "\n"


def _package_files():
    root = os.path.join(HERE, "convd")
    for name in sorted(os.listdir(root)):
        if name.endswith(".py"):
            yield os.path.join(root, name), f"convd/{name}"


def _record_line(arc: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arc},sha256={digest},{len(data)}"


def _write_wheel(directory: str, entries) -> str:
    _, name, version = _names()
    dist_info = f"{name}-{version}.dist-info"
    wheel_name = f"{name}-{version}-{TAG}.whl"
    records = []
    with zipfile.ZipFile(os.path.join(directory, wheel_name), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in entries:
            z.writestr(arc, data)
            records.append(_record_line(arc, data))
        for arc, data in (
            (f"{dist_info}/METADATA", _metadata().encode()),
            (f"{dist_info}/WHEEL", _wheel_file().encode()),
        ):
            z.writestr(arc, data)
            records.append(_record_line(arc, data))
        records.append(f"{dist_info}/RECORD,,")
        z.writestr(f"{dist_info}/RECORD", "\n".join(records) + "\n")
    return wheel_name


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _, name, version = _names()
    dist_info = f"{name}-{version}.dist-info"
    os.makedirs(os.path.join(metadata_directory, dist_info), exist_ok=True)
    with open(os.path.join(metadata_directory, dist_info, "METADATA"), "w") as f:
        f.write(_metadata())
    with open(os.path.join(metadata_directory, dist_info, "WHEEL"), "w") as f:
        f.write(_wheel_file())
    return dist_info


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    entries = [(arc, open(path, "rb").read()) for path, arc in _package_files()]
    return _write_wheel(wheel_directory, entries)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, [("convd_editable.pth", (HERE + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    _, name, version = _names()
    base = f"{name}-{version}"
    out = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, out), "w:gz") as t:
        for rel in ["pyproject.toml", "README.md", "_build/convd_build.py"]:
            path = os.path.join(HERE, rel)
            if os.path.exists(path):
                t.add(path, arcname=f"{base}/{rel}")
        for path, arc in _package_files():
            t.add(path, arcname=f"{base}/{arc}")
        pkg_info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = _metadata().encode()
        pkg_info.size = len(data)
        import io

        t.addfile(pkg_info, io.BytesIO(data))
    return out
