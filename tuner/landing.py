"""`kdispatch add <path>`: land a candidate variant, with its provenance.

Two kinds of candidate, as coding agents produce them:

- a kdispatch variant module (`.py` registering one or more variants with
  `@kdispatch.registry.variant`): imported in isolation, checked, then copied to
  `kernels/<backend>/<family>/<file>` (with the extra source files its variants hash, e.g. a `.cu`);
- a FlashInfer-Bench `solution.json` (Python, Triton, CUDA/C++ or TileLang sources): validated with
  flashinfer_bench's `Solution` model and stored as `kernels/<backend>/<family>/fib_<name>.solution.json`
  next to a generated wrapper module `fib_<name>.py` that registers it as a variant and builds it
  through flashinfer_bench's `BuilderRegistry` on first call (destination-passing solutions get
  their outputs allocated; GDN's in-place state contract is honoured by copying the new state into
  `state`).

Checks: the definition exists; the variant is not the reference nor a baseline, and does not
replace one (those cannot be landed this way); its name is new (or `--force` replaces an earlier
landed candidate of the same file); its callable accepts the definition's inputs in order; the
landed copy imports and registers the same variants. Provenance (author or agent, parent variant,
date, original path, sha256) goes to a sidecar `<stem>.provenance.json`. The next `kdispatch tune`
measures only the new variant (its source hash is new) and regenerates the routers.
"""
from __future__ import annotations

import datetime
import getpass
import hashlib
import importlib
import importlib.util
import inspect
import json
import re
import shutil
import subprocess
from pathlib import Path

from kdispatch import definitions as defs
from kdispatch import registry

KERNELS_DIR = Path(__file__).resolve().parents[1] / "kernels"
FIB_BACKENDS = {"python": "torch", "triton": "triton", "cuda": "cuda", "cpp": "cuda", "tilelang": "cuda"}
DEFAULT_ARCHS = ("sm90", "sm100")


class LandingError(ValueError):
    pass


def family_of(definition: str) -> str:
    """The kernels/<backend>/<family>/ folder of a definition's variants (its spec says)."""
    return defs.get(definition).spec.family


def default_author() -> str:
    try:
        out = subprocess.run(["git", "config", "user.name"], capture_output=True, text=True, timeout=5)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except Exception:
        pass
    try:
        return getpass.getuser()
    except Exception:
        return "unknown"


def _protected(definition: str) -> set[str]:
    """Names that can never be landed: the reference and every baseline of the definition."""
    names = {registry.REFERENCE}
    names.update(v.name for v in registry.variants(definition) if v.baseline)
    return names


def _check_callable(v: registry.Variant) -> None:
    n = len(defs.load(v.definition)["inputs"])
    try:
        inspect.signature(v.fn).bind(*range(n))
    except TypeError as exc:
        raise LandingError(f"variant {v.name!r}: its callable does not accept the {n} inputs of "
                           f"{v.definition} in order ({exc})") from None
    except ValueError:
        pass  # builtins without a signature


def _check_new(definition: str, name: str, force: bool, target: Path, ignore=None) -> None:
    if name in _protected(definition):
        raise LandingError(f"{definition}: {name!r} is the reference or a baseline; it cannot be replaced by a candidate")
    try:
        old = registry.get(definition, name)
    except KeyError:
        return
    if old is ignore:  # the candidate itself, registered by its trial import
        return
    if not force or old.source != target.resolve():
        raise LandingError(f"{definition}: a variant named {name!r} exists ({old.source}); "
                           "pick another name (or --force to replace an earlier landed candidate of the same file)")


def _provenance(path: Path, kind: str, variants: list[dict], author: str | None, parent: str | None,
                date: str | None) -> dict:
    return {"kind": kind, "variants": variants, "author": author or default_author(), "parent": parent,
            "date": date or datetime.date.today().isoformat(), "source": str(path),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "landed_by": "kdispatch add"}


def _module_name(target: Path, kernels_dir: Path) -> str:
    rel = target.resolve().relative_to(kernels_dir.resolve()).with_suffix("")
    return "kdispatch.kernels." + ".".join(rel.parts)


def _ensure_package(dirpath: Path, kernels_dir: Path) -> None:
    d = dirpath
    while d.resolve() != kernels_dir.resolve() and kernels_dir.resolve() in d.resolve().parents:
        init = d / "__init__.py"
        if not init.exists():
            d.mkdir(parents=True, exist_ok=True)
            init.write_text("")
        d = d.parent


def add(path, *, author: str | None = None, parent: str | None = None, archs=None, force: bool = False,
        kernels_dir: Path | str | None = None, date: str | None = None, verify_import: bool = True) -> dict:
    """Lands a candidate; returns its provenance record (with "files": the paths written)."""
    path = Path(path)
    if not path.exists():
        raise LandingError(f"no such file: {path}")
    kernels_dir = Path(kernels_dir) if kernels_dir is not None else KERNELS_DIR
    registry.discover()
    if path.suffix == ".json":
        return _add_solution(path, author, parent, tuple(archs or DEFAULT_ARCHS), force, kernels_dir, date,
                             verify_import)
    if path.suffix == ".py":
        return _add_module(path, author, parent, force, kernels_dir, date, verify_import)
    raise LandingError(f"{path}: expected a kdispatch variant module (.py) or a FlashInfer-Bench solution (.json)")


def _registered() -> dict[tuple[str, str], registry.Variant]:
    return {(d, v.name): v for d in defs.names() for v in registry.variants(d)}


def _add_module(path: Path, author, parent, force, kernels_dir: Path, date, verify_import) -> dict:
    if force:  # forget an earlier landed copy of this file, so the candidate can register its names
        for (d, n), v in _registered().items():
            src = v.source
            if src is not None and src.name == path.name and kernels_dir.resolve() in src.parents \
                    and n not in _protected(d):
                registry.unregister(d, n)
    before = _registered()
    tmp_name = "_kdispatch_candidate_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(tmp_name, path)
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except Exception as exc:
        for key, v in _registered().items():
            if key not in before:
                registry.unregister(*key)
        raise LandingError(f"{path}: import failed: {type(exc).__name__}: {exc}") from exc
    new = [v for key, v in _registered().items() if key not in before]
    try:
        if not new:
            raise LandingError(f"{path}: registers no new variant (decorate the callable with "
                               "@kdispatch.registry.variant(definition, name, backend=..., archs=...))")
        backends = {v.backend for v in new}
        families = {family_of(v.definition) for v in new}
        if len(backends) != 1 or len(families) != 1:
            raise LandingError(f"{path}: variants of one module must share a backend and a family, got "
                               f"{sorted(backends)} / {sorted(families)}")
        backend, family = backends.pop(), families.pop()
        dest = kernels_dir / backend / family
        target = dest / path.name
        for v in new:
            if v.baseline:
                raise LandingError(f"variant {v.name!r} declares baseline=True: baselines cannot be landed by `add`")
            _check_new(v.definition, v.name, force, target, ignore=v)
            _check_callable(v)
            if parent is not None:
                registry.get(v.definition, parent)  # KeyError names the known variants
        if target.exists() and not force:
            raise LandingError(f"{target} exists (use --force to replace an earlier landed candidate)")
        # Kernel sources beside the candidate that its provenance found (e.g. a .cu) travel with it.
        extras = sorted({s for v in new for s in v.files if s.parent == path.resolve().parent and s != v.source})
    finally:
        for v in new:
            registry.unregister(v.definition, v.name)
    _ensure_package(dest, kernels_dir)
    files = [target]
    shutil.copyfile(path, target)
    for s in extras:
        shutil.copyfile(s, dest / s.name)
        files.append(dest / s.name)
    info = [{"definition": v.definition, "name": v.name, "backend": v.backend, "archs": list(v.archs)} for v in new]
    prov = _provenance(path, "kdispatch-module", info, author, parent, date)
    side = target.with_suffix(".provenance.json")
    side.write_text(json.dumps(prov, indent=1, sort_keys=True) + "\n")
    files.append(side)
    if verify_import:
        _verify(target, kernels_dir, {(v.definition, v.name) for v in new}, files)
    prov["files"] = [str(f) for f in files]
    return prov


def _verify(target: Path, kernels_dir: Path, expect: set, files: list[Path]) -> None:
    """Imports the landed copy as part of kdispatch.kernels; removes the files again on failure."""
    try:
        if kernels_dir.resolve() == KERNELS_DIR.resolve():
            importlib.invalidate_caches()
            importlib.import_module(_module_name(target, kernels_dir))
        else:  # a test's kernels folder: load by path
            spec = importlib.util.spec_from_file_location("_kdispatch_landed_" + target.stem, target)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
        got = set(_registered())
        if not expect <= got:
            raise LandingError(f"the landed copy {target} did not register {sorted(expect - got)}")
    except Exception:
        for f in files:
            f.unlink(missing_ok=True)
        raise


_WRAPPER = '''"""FlashInfer-Bench solution {sol_name!r} by {author} for {definition}, landed by `kdispatch add`.

Built on first call through flashinfer_bench's BuilderRegistry from {json_name} ({language});
provenance (author, parent, date) in {prov_name}. Generated: edit the solution, not this file.
"""
from __future__ import annotations

from pathlib import Path

from kdispatch.registry import variant

_SOLUTION = Path(__file__).with_name({json_name!r})
_DEFINITION = {definition!r}
_IN_PLACE = {in_place!r}  # (output index, input index): outputs the kdispatch contract updates in place
_built = {{}}


def _build():
    if not _built:
        from flashinfer_bench.compile import BuilderRegistry
        from flashinfer_bench.data import Definition, Solution

        from kdispatch import definitions

        definition = Definition.model_validate(definitions.load(_DEFINITION))
        solution = Solution.model_validate_json(_SOLUTION.read_text())
        _built["definition"] = definition
        _built["runnable"] = BuilderRegistry.get_instance().build(definition, solution)
    return _built["definition"], _built["runnable"]


@variant(_DEFINITION, {name!r}, backend={backend!r}, archs={archs!r}, requires={requires!r},
         meta={meta!r})
def {fn_name}(*args):
    definition, run = _build()
    if run.metadata.destination_passing_style:
        from flashinfer_bench.bench.evaluators.utils import allocate_outputs

        device = next(str(a.device) for a in args if hasattr(a, "device"))
        outs = allocate_outputs(definition, list(args), device)
        run(*args, *outs)
        result = tuple(outs)
    else:
        result = run(*args)
        result = tuple(result) if isinstance(result, (tuple, list)) else (result,)
    if _IN_PLACE:
        result = list(result)
        for o, i in _IN_PLACE:
            if result[o] is not args[i]:
                result[o] = args[i].copy_(result[o])
        result = tuple(result)
    return result if len(result) > 1 else result[0]
'''


def _add_solution(path: Path, author, parent, archs, force, kernels_dir: Path, date, verify_import) -> dict:
    try:
        from flashinfer_bench.data import Solution
    except ImportError as exc:
        raise LandingError("landing a FlashInfer-Bench solution needs the flashinfer_bench package") from exc
    try:
        sol = Solution.model_validate_json(path.read_text())
    except Exception as exc:
        raise LandingError(f"{path}: not a valid FlashInfer-Bench solution: {exc}") from exc
    try:
        definition = defs.resolve_name(sol.definition)
    except ValueError as exc:
        raise LandingError(f"{path}: {exc}") from None
    name = re.sub(r"[^0-9a-zA-Z_]", "_", sol.name)
    language = sol.spec.language.value
    backend = FIB_BACKENDS.get(language)
    if backend is None:
        raise LandingError(f"{path}: language {language!r} is not supported")
    family = family_of(definition)
    dest = kernels_dir / backend / family
    stem = f"fib_{name}"
    target = dest / f"{stem}.py"
    _check_new(definition, name, force, target)
    if parent is not None:
        registry.get(definition, parent)
    if target.exists() and not force:
        raise LandingError(f"{target} exists (use --force to replace an earlier landed candidate)")
    d = defs.get(definition)
    in_place = tuple((d.outputs.index(o), d.inputs.index(i)) for o, i in d.spec.in_place.items())
    requires = ("flashinfer_bench",) + (("triton",) if language == "triton" else ()) + \
        (("tilelang",) if language == "tilelang" else ())
    prov = _provenance(path, "flashinfer-bench-solution",
                       [{"definition": definition, "name": name, "backend": backend, "archs": list(archs)}],
                       author or sol.author, parent, date)
    meta = {"author": prov["author"], "parent": parent, "date": prov["date"], "solution": sol.name}
    _ensure_package(dest, kernels_dir)
    json_path = dest / f"{stem}.solution.json"
    shutil.copyfile(path, json_path)
    target.write_text(_WRAPPER.format(sol_name=sol.name, author=prov["author"], definition=definition,
                                      json_name=json_path.name, language=language, prov_name=f"{stem}.provenance.json",
                                      in_place=in_place, name=name, backend=backend, archs=tuple(archs),
                                      requires=requires, meta=meta, fn_name=stem))
    side = dest / f"{stem}.provenance.json"
    side.write_text(json.dumps(prov, indent=1, sort_keys=True) + "\n")
    files = [target, json_path, side]
    if verify_import:
        _verify(target, kernels_dir, {(definition, name)}, files)
    prov["files"] = [str(f) for f in files]
    return prov
