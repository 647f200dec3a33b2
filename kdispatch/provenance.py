"""Provenance: which files a variant's behaviour depends on, and one hash over them.

A variant depends on
- the module that defines it, and every project module it imports, transitively: `import` and
  `from ... import` statements anywhere in the module (function bodies too), relative ones
  included, resolved inside the `kdispatch` package (kernels and references included) or, for a
  module outside it (a test's or a landed candidate's), inside that module's folder;
- kernel sources: string constants in those modules that name an existing file beside the module
  (`Path(__file__).with_name("topk_select.cu")`, a FlashInfer-Bench `.solution.json`), and the
  files they `#include "..."`, transitively;
- for a library-backed variant (backend "library"), the installed versions of the distributions
  that provide the modules it requires: a new FlashInfer or fla-core is a new variant.

`kdispatch.registry` is not followed: it is the registration decorator every variant imports, and
does not change what any kernel computes; nor is the package's `__init__` (`from kdispatch import
nvrtc` names it), which only loads submodules lazily and exports names.

The hash covers each file's name (not its path, so a moved file keeps its hash) and bytes, sorted
by name, plus the variant's name (two variants of one file differ) and the library versions.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import importlib.util
import re
from pathlib import Path

_PACKAGE_ROOT = Path(__file__).resolve().parent  # kdispatch/
_PROJECT_ROOT = _PACKAGE_ROOT.parent
# setup.py's package_dir: top-level folders that are subpackages of kdispatch.
_MAPPED = {"kdispatch.kernels": _PROJECT_ROOT / "kernels", "kdispatch.routers": _PROJECT_ROOT / "routers",
           "kdispatch.tuner": _PROJECT_ROOT / "tuner"}
NOT_FOLLOWED = frozenset({"kdispatch", "kdispatch.registry"})
_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def module_path(name: str) -> Path | None:
    """The source file of a kdispatch module (without importing it), or None."""
    if name != "kdispatch" and not name.startswith("kdispatch."):
        return None
    for prefix, folder in _MAPPED.items():
        if name == prefix or name.startswith(prefix + "."):
            rel = name[len(prefix):].lstrip(".").split(".") if name != prefix else []
            base = folder.joinpath(*rel)
            break
    else:
        base = _PACKAGE_ROOT.joinpath(*name.split(".")[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate.resolve()
    return None


def _module_name_of(path: Path) -> str | None:
    """The dotted kdispatch name of a file inside the package (or a mapped folder), else None."""
    path = path.resolve()
    for prefix, folder in (("kdispatch", _PACKAGE_ROOT), *_MAPPED.items()):
        try:
            rel = path.relative_to(folder.resolve())
        except ValueError:
            continue
        parts = list(rel.with_suffix("").parts)
        if parts and parts[-1] == "__init__":
            parts = parts[:-1]
        return ".".join([prefix, *parts])
    return None


def _imported_names(tree: ast.AST, own: str | None, is_package: bool) -> list[str]:
    """Dotted names an AST imports; `from a import b` yields both a and a.b (b may be a module)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                if own is None:
                    base = "." * node.level + base  # resolved against the file's folder below
                else:
                    parts = own.split(".") if is_package else own.split(".")[:-1]
                    parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                    base = ".".join(p for p in (*parts, node.module) if p)
            out.append(base)
            out += [f"{base}.{a.name}" if base else a.name for a in node.names]
    return out


def _resolve(name: str, beside: Path) -> Path | None:
    """A project module's file: inside kdispatch, or a module file next to an outside module."""
    if name.startswith("."):  # a relative import of a module outside the package
        name = name.lstrip(".")
        if not name:
            return None
    if name in NOT_FOLLOWED:
        return None
    found = module_path(name)
    if found is not None:
        return found
    local = beside / (name.replace(".", "/") + ".py")
    return local.resolve() if local.is_file() else None


def _beside(tree: ast.AST, folder: Path) -> set[Path]:
    """Existing files beside the module that its string constants name (kernel sources)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and 0 < len(node.value) < 200 \
                and "/" not in node.value and "\n" not in node.value and not node.value.endswith(".py"):
            p = folder / node.value
            if p.is_file():
                out.add(p.resolve())
    return out


def _includes(source: Path, seen: set[Path]) -> None:
    for inc in _INCLUDE.findall(source.read_text(errors="replace")):
        p = (source.parent / inc).resolve()
        if p.is_file() and p not in seen:
            seen.add(p)
            _includes(p, seen)


@functools.lru_cache(maxsize=None)
def files_of(module_file: Path) -> frozenset[Path]:
    """Every file the module depends on (itself included), transitively. Cached per file: call
    `files_of.cache_clear()` after editing sources in a running process."""
    seen: set[Path] = set()
    todo = [Path(module_file).resolve()]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        if path.suffix != ".py":
            _includes(path, seen)
            continue
        tree = ast.parse(path.read_text(), str(path))
        own = _module_name_of(path)
        for name in _imported_names(tree, own, path.name == "__init__.py"):
            dep = _resolve(name, path.parent)
            if dep is not None and dep not in seen:
                todo.append(dep)
        for src in _beside(tree, path.parent) - seen:
            todo.append(src)
    return frozenset(seen)


def library_versions(modules) -> dict[str, str]:
    """{top-level module: installed version of the distribution providing it, or "absent"}."""
    return {m.split(".")[0]: _installed_version(m.split(".")[0]) for m in modules}


@functools.lru_cache(maxsize=None)
def _installed_version(top: str) -> str:
    """Looked up once a process: reading every installed distribution's metadata took ~0.25 s a call
    (more on the GPU machine's long path), once per measured row of a library variant in a tune."""
    for d in _module_distributions().get(top, []):
        try:
            return importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "absent"


@functools.lru_cache(maxsize=None)
def _module_distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def digest(name: str, files, versions: dict[str, str] | None = None) -> str:
    """sha256 (16 hex) over the variant's name, its files (name + bytes, sorted by name then path)
    and library versions."""
    h = hashlib.sha256(f"variant:{name}\n".encode())
    for p in sorted(files, key=lambda p: (p.name, str(p))):
        h.update(f"file:{p.name}:{p.stat().st_size}\n".encode())
        h.update(p.read_bytes())
    for mod, version in sorted((versions or {}).items()):
        h.update(f"library:{mod}=={version}\n".encode())
    return h.hexdigest()[:16]
