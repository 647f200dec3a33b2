"""Argument checking against a definition: dtype, rank, constant and shared axes, device, constraints.

`check` runs on the slow path only (a call whose tensor signature the dispatcher has not seen), so it
may be thorough; it never reads device memory (no sync) unless asked to (`sync=True`, the checked
mode KDISPATCH_CHECK=1): value constraints such as `total_seq_len == cu_seqlens[-1].item()` are
otherwise evaluated only for CPU tensors. Constraints over scalar arguments alone (e.g. MoE's
`local_expert_offset` range) change from call to call without changing the tensor signature:
`check_scalars` evaluates them, and the dispatcher runs it on every call of such a definition.

A signature that passed is remembered with its variable axes left open (`_Shapeless`): a later call
that differs only in those axes (an engine's prefill brings a new token count nearly every call) is
checked by one C++ guard over every tensor (dtype, device, rank, constant sizes, fixed strides) and a
few lines for the rest (each variable axis equal wherever it appears, contiguity where a variable
axis moves the strides, the scalars, the constraints): what the full check accepts, for a third of
its time.
"""
from __future__ import annotations

import ast
import math
import operator

import torch

from kdispatch import definitions
from kdispatch.workloads import DTYPES

try:
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:  # a torch without dynamo's guards: every call gets the full check
    _TensorGuards = None

SHAPELESS = 4  # signatures kept with their variable axes open, per definition

# Constraints the contest's own workloads break; the definitions' semantics cover them, so they are
# documented rather than enforced.
NOT_ENFORCED = {
    # 54% of the indexer workloads have max_num_pages * 64 < 2048: the output is padded with -1.
    "topk <= max_num_pages * page_size",
}



class Checker:
    """Checks one definition's argument tuple; `check(args)` returns the variable-axis values."""

    def __init__(self, definition, op_name: str):
        d = definitions.get(definition["name"] if isinstance(definition, dict) else definition)
        self.op = op_name
        self.inputs = list(d.data["inputs"].items())
        self.const = d.const_axes
        self.var_axes = d.var_axes
        self.constraints = [c for c in [*d.data.get("constraints", []), *d.spec.constraints] if c not in NOT_ENFORCED]
        self.tensor_positions = tuple(i for i, (_, s) in enumerate(self.inputs) if s["shape"] is not None)
        self.strided = d.spec.strided
        self.strided_positions = tuple(i for i, (n, _) in enumerate(self.inputs) if n in self.strided)
        # straight-line: a generator over the positions cost ~1 us of every new shape's decision
        self._strided_test = eval("lambda args: " + (" or ".join(
            f"(args[{i}] is not None and not args[{i}].is_contiguous())" for i in self.strided_positions) or "False"))
        scalars = {n for n, s in self.inputs if s["shape"] is None}
        self.scalar_constraints = [c for c in self.constraints if _names(c) & scalars and _names(c) <= scalars | set(self.const)]
        # compiled once: eval() of the text on every call cost ~7 us
        self._scalar_checks = [(c, self._over_args(c)) for c in self.scalar_constraints]
        # every constraint, compiled once (a new call signature evaluates them all: parsing the text
        # each time was most of that check's cost); the ones reading device memory marked
        self._constraints = [(c, compile(c, f"<constraint {c}>", "eval"), ".item()" in c) for c in self.constraints]
        # their int scalars, type-checked on every call too (a float offset would pass the range check)
        used = set().union(*map(_names, self.scalar_constraints))
        self._int_scalars = [i for i, (n, s) in enumerate(self.inputs)
                             if n in used and s["shape"] is None and s["dtype"].startswith("int")]
        # each variable axis's first carrier among the required tensors, (axis, position, dim), for `axes`;
        # None when an axis is carried by optional inputs only
        first = {}
        for i, (_, s) in enumerate(self.inputs):
            if s["shape"] is not None and not s.get("optional"):
                for j, axis in enumerate(s["shape"]):
                    if axis in self.var_axes:
                        first.setdefault(axis, (axis, i, j))
        self._carriers = [first[a] for a in self.var_axes] if all(a in first for a in self.var_axes) else None
        self._fast = self._compile_fast()
        self._lean = self._compile_fast(lean=True) if self._fast is not None and _TensorGuards is not None else None
        self._optional = tuple(i for i in self.tensor_positions if self.inputs[i][1].get("optional"))
        self._shapeless: list[_Shapeless] = []  # the most recent first

    def _fail(self, arg: str, expected: str, given) -> ValueError:
        return ValueError(f"{self.op}: argument {arg!r} expected {expected}, got {given}")

    def check(self, args, sync: bool = False) -> dict[str, int]:
        """The variable axes of a valid call; ValueError naming the argument otherwise. `sync`: also
        evaluate the constraints that read device memory."""
        if not sync and self._fast is not None:
            for known in self._shapeless:
                axes = known.check(args, self._lean)
                if axes is not None:
                    return axes
            axes = self._fast(args)
            if axes is not None:
                self._remember(args)
                return axes
        return self._check(args, sync)

    def _remember(self, args) -> None:
        """Keeps this valid call's signature with its variable axes open (at most SHAPELESS kept)."""
        if self._lean is None:
            return
        try:
            known = _Shapeless(self, args)
        except Exception:  # a tensor the guard cannot take: the full check serves such calls
            return
        self._shapeless.insert(0, known)
        del self._shapeless[SHAPELESS:]

    def _compile_fast(self, lean: bool = False):
        """`check` as straight-line code for this definition: the variable axes of a call that passes
        every check below, None for any other (which `_check` then explains; it accepts nothing
        this rejects, and this accepts nothing it rejects). A third of the generic loop's time. None
        where the definition has something the generator does not know (the generic check serves).
        `lean`: only what a `_Shapeless` guard leaves open (variable axes, contiguity where they move
        the strides, scalars, constraints), for calls that passed that guard."""
        lines, consts = ["def fast(args):", "  try:", f"    if len(args) != {len(self.inputs)}: return None",
                         "    dev = None"], {}
        required = [i for i in self.tensor_positions if not self.inputs[i][1].get("optional")]
        if lean and required:  # the guard passed: every tensor is on the device of the call it was made from
            lines.append(f"    dev = args[{required[0]}].device")
        local = {a: f"a_{i}" for i, a in enumerate(self.var_axes)}
        lines += [f"    {v} = None" for v in local.values()]
        for i, (name, spec) in enumerate(self.inputs):
            lines.append(f"    x = args[{i}]")
            optional = bool(spec.get("optional"))
            if spec["shape"] is None:
                ok = ("type(x) is int" if spec["dtype"].startswith("int")
                      else "(type(x) is float or type(x) is int) and _isfinite(x)")
                lines.append(f"    if {'x is not None and ' if optional else ''}not ({ok}): return None")
                continue
            pad = "    "
            if optional:
                lines.append("    if x is not None:")
                pad = "      "
            consts[f"D{i}"] = DTYPES[spec["dtype"]]
            shape = spec["shape"]
            if not lean:
                lines.append(f"{pad}if not isinstance(x, _Tensor) or x.dtype is not D{i} or x.dim() != {len(shape)}: "
                             "return None")
            if lean and not any(axis in local for axis in shape):
                continue  # the guard holds its sizes and strides
            lines.append(f"{pad}s = x.shape")
            for j, axis in enumerate(shape):
                if axis in self.const:
                    if not lean:
                        lines.append(f"{pad}if s[{j}] != {int(self.const[axis])}: return None")
                elif axis in local:
                    v = local[axis]
                    lines += [f"{pad}if {v} is None: {v} = s[{j}]", f"{pad}elif s[{j}] != {v}: return None"]
                else:
                    return None  # an axis neither constant nor variable
            if not lean:
                lines += [f"{pad}if dev is None: dev = x.device", f"{pad}elif x.device != dev: return None"]
            if lean and not _moving_strides(shape, local):
                continue  # the guard holds its strides
            contiguous = "x.is_contiguous()"
            if name in self.strided:
                contiguous += f" or {len(shape) == 0} or x.stride(-1) == 1 or s[-1] == 1"
            lines.append(f"{pad}if not ({contiguous}): return None")
        position = {n: i for i, (n, _) in enumerate(self.inputs)}
        for c, _code, reads_device in self._constraints:
            try:
                expr = _Rename(self.const, local, position).visit(ast.parse(c, mode="eval")).body
            except KeyError:  # a name that is no axis nor input
                return None
            test = f"not ({ast.unparse(expr)})"
            if reads_device:
                test = f"dev is not None and dev.type == 'cpu' and {test}"
            lines.append(f"    if {test}: return None")
        lines += [f"    if {v} is None: return None" for v in local.values()]
        lines.append("    return {" + ", ".join(f"{a!r}: {v}" for a, v in local.items()) + "}")
        lines += ["  except Exception:", "    return None"]
        scope = {"_Tensor": torch.Tensor, "_isfinite": math.isfinite, **consts}
        exec(compile("\n".join(lines), f"<fast check of {self.op}>", "exec"), scope)
        return scope["fast"]

    def _check(self, args, sync: bool = False) -> dict[str, int]:
        if len(args) != len(self.inputs):
            names = [n for n, _ in self.inputs]
            raise ValueError(f"{self.op}: expected {len(self.inputs)} arguments {names}, got {len(args)}")
        bound: dict[str, int] = {}
        where: dict[str, str] = {}
        device = None
        first = None
        for (name, spec), x in zip(self.inputs, args):
            if spec["shape"] is None:
                self._check_scalar(name, spec, x)
                continue
            if x is None and spec.get("optional"):
                continue
            if not isinstance(x, torch.Tensor):
                raise self._fail(name, f"a torch.Tensor of {spec['dtype']}", type(x).__name__)
            want = DTYPES[spec["dtype"]]
            if x.dtype != want:
                raise self._fail(name, f"dtype {spec['dtype']}", str(x.dtype).replace("torch.", ""))
            shape = spec["shape"]
            if x.dim() != len(shape):
                raise self._fail(name, f"{len(shape)} dims {shape}", f"shape {tuple(x.shape)}")
            for axis, size in zip(shape, x.shape):
                if axis in self.const:
                    if size != self.const[axis]:
                        raise self._fail(name, f"{axis} = {self.const[axis]} in shape {shape}", f"shape {tuple(x.shape)}")
                elif axis in bound:
                    if size != bound[axis]:
                        raise self._fail(name, f"{axis} = {bound[axis]} (from {where[axis]!r}) in shape {shape}",
                                         f"shape {tuple(x.shape)}")
                else:
                    bound[axis], where[axis] = size, name
            if device is None:
                device, first = x.device, name
            elif x.device != device:
                raise self._fail(name, f"device {device} (like {first!r})", f"device {x.device}")
            if not x.is_contiguous() and not (name in self.strided and (x.dim() == 0 or x.stride(-1) == 1
                                                                            or x.shape[-1] == 1)):
                raise self._fail(name, "a contiguous tensor" + (", or a view whose last dimension is contiguous"
                                                                if name in self.strided else ""),
                                 f"strides {tuple(x.stride())}")
        self._check_constraints(args, bound, where, device, sync)
        return {k: bound[k] for k in self.var_axes if k in bound}

    def axes(self, args) -> dict[str, int]:
        """The variable axes `check` returns for a valid call, read without checking anything: for a
        choice that runs no kernel of kdispatch's (a call handed back to an engine). IndexError,
        AttributeError or TypeError where the call is too malformed to read them."""
        return {a: args[i].shape[j] for a, i, j in self._carriers}

    def is_strided(self, args) -> bool:
        """Does this (valid) call pass a strided view where the definition allows one?"""
        return self._strided_test(args)

    def _check_scalar(self, name, spec, x):
        if spec["dtype"].startswith("int"):
            ok = isinstance(x, int) and not isinstance(x, bool)
        else:
            ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
        if not ok and not (x is None and spec.get("optional")):
            raise self._fail(name, f"a finite Python {'int' if spec['dtype'].startswith('int') else 'float'}",
                             repr(x))

    def _over_args(self, expr: str):
        """`expr` as a function of the call's argument tuple: inputs read by position, constant axes
        inlined."""
        position = {n: i for i, (n, _) in enumerate(self.inputs)}
        const = self.const

        class Bind(ast.NodeTransformer):
            def visit_Name(self, node):
                new = (ast.Constant(const[node.id]) if node.id in const else
                       ast.Subscript(ast.Name("args", ast.Load()), ast.Constant(position[node.id]), ast.Load()))
                return ast.copy_location(new, node)

        body = Bind().visit(ast.parse(expr, mode="eval")).body
        signature = ast.arguments(posonlyargs=[], args=[ast.arg("args")], kwonlyargs=[], kw_defaults=[], defaults=[])
        tree = ast.fix_missing_locations(ast.Expression(ast.Lambda(signature, body)))
        return eval(compile(tree, f"<constraint {expr}>", "eval"), {"__builtins__": {}})

    def check_scalars(self, args) -> None:
        """ValueError if a constraint over the scalar arguments alone does not hold (every call)."""
        for i in self._int_scalars:
            if type(args[i]) is not int:
                self.check(args)  # names the argument
        for c, holds in self._scalar_checks:
            try:
                ok = holds(args)
            except (IndexError, TypeError):  # too few arguments or a scalar of the wrong type
                self.check(args)  # names the argument
                raise
            if not ok:
                given = ", ".join(f"{n}={x!r}" for (n, _), x in zip(self.inputs, args) if n in _names(c))
                raise ValueError(f"{self.op}: constraint `{c}` does not hold ({given})")

    def _check_constraints(self, args, bound, where, device, sync=False):
        env = {**self.const, **bound}
        env.update({n: x for (n, _), x in zip(self.inputs, args)})
        for c, code, reads_device in self._constraints:
            if reads_device and not sync and (device is None or device.type != "cpu"):
                continue  # would need a device sync
            try:
                ok = eval(code, {"__builtins__": {}}, env)  # definition constraints are plain expressions
            except (NameError, TypeError, IndexError, AttributeError):
                continue  # refers to an optional input that was not given
            if not ok:
                shown = ", ".join(f"{k}={v} from {where[k]!r}" for k, v in bound.items() if k in c)
                args_in = [n for n, _ in self.inputs if n in c]
                raise ValueError(f"{self.op}: constraint `{c}` does not hold ({shown or ', '.join(args_in)})")


class _Shapeless:
    """A valid call's signature with its variable axes left open: one C++ guard over its tensors
    (dtype, device, rank, requires_grad, the constant sizes, every stride a variable axis cannot move)
    and which optional tensors it passed; the checker's lean function checks the rest."""

    __slots__ = ("guard", "tensors", "optional", "absent")

    def __init__(self, checker: Checker, args):
        present = [i for i in checker.tensor_positions if args[i] is not None]
        sizes, strides = [], []
        for i in present:
            x, shape = args[i], checker.inputs[i][1]["shape"]
            open_dims = [j for j, axis in enumerate(shape) if axis in checker.var_axes]
            last = max(open_dims, default=-1)  # a dim's stride is the sizes after it, for contiguous tensors
            sizes.append([None if j in open_dims else int(n) for j, n in enumerate(x.shape)])
            strides.append([None if j < last else int(st) for j, st in enumerate(x.stride())])
        tensors = [args[i] for i in present]
        self.guard = _TensorGuards(*tensors, dynamic_dims_sizes=sizes, dynamic_dims_strides=strides).check
        self.tensors = operator.itemgetter(*present) if len(present) > 1 else (lambda a, i=present[0]: (a[i],))
        self.optional = checker._optional
        self.absent = tuple(args[i] is None for i in self.optional)
        if not self.guard(*tensors):
            raise ValueError("the guard does not hold on the call it was made from")

    def check(self, args, lean):
        """The variable axes where `args` passes this guard and the lean check, else None."""
        try:
            if self.optional and tuple(args[i] is None for i in self.optional) != self.absent:
                return None
            if not self.guard(*self.tensors(args)):
                return None
        except (IndexError, TypeError):  # too few arguments, or not a tensor
            return None
        return lean(args)


def _moving_strides(shape, variable) -> bool:
    """Whether a variable axis moves this tensor's strides (one after the first dim does)."""
    return any(axis in variable for axis in shape[1:])


class _Rename(ast.NodeTransformer):
    """A constraint's names for the fast check: constant axes inlined, variable axes as its locals,
    inputs as `args[i]`."""

    def __init__(self, const, local, position):
        self.const, self.local, self.position = const, local, position

    def visit_Name(self, node):
        if node.id in self.const:
            new = ast.Constant(self.const[node.id])
        elif node.id in self.local:
            new = ast.Name(self.local[node.id], ast.Load())
        else:
            new = ast.Subscript(ast.Name("args", ast.Load()), ast.Constant(self.position[node.id]), ast.Load())
        return ast.copy_location(new, node)


def _names(expr: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(expr, mode="eval")) if isinstance(n, ast.Name)}
