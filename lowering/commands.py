"""The commands ``lowering`` adds to the ``hostir`` command line: ``hostir plan``, which
shows a redistribution plan and its cost.

``hostir plan --mesh 2x2 --shape 8x8 --from S0S0 --to RR`` prints
``ExplainedPlan.explain()`` (``--explain``: with the candidate plans compared) for
resharding a tensor of that shape between the two distributions (notation: one
placement per mesh dim, outer first — ``S<d>``, ``R``, ``P``; see
``lowering.redistribution.distribution.parse_notation``). The command belongs to
``lowering``: this package declares it (``add_plan_command``) and registers it with the
``hostir`` command line through the ``hostir.commands`` entry point
(pyproject.toml), so ``hostir`` never imports ``lowering``.
"""

from __future__ import annotations

import argparse
import math

from hostir import Const, DType, Mesh, TensorValue
from hostir.errors import HostIrError, SettingError
from hostir.settings import parse_count
from lowering.errors import ReshardingError
from lowering.redistribution.distribution import parse_notation
from lowering.redistribution.plan_resharding import plan_resharding

MAX_PLAN_DEVICES = 1 << 16
"""The largest mesh ``plan`` takes (65,536 devices): planning holds a mesh's device list,
so its time and memory grow with the device count (a 99999x99999 mesh ran out of
memory)."""

MAX_EXTENT = 1 << 62
"""The largest tensor extent ``plan`` takes (torch extents are int64)."""


def _sizes(text: str, what: str, maximum: int) -> tuple[int, ...]:
    """The sizes of ``2x4`` (ASCII digits, each in [1, maximum])."""
    sizes = []
    for part in text.lower().split("x"):
        if not part.isascii() or not part.isdigit():
            raise ReshardingError(f"{what} {text!r}: expected sizes like 2x2 or 8x8")
        try:
            sizes.append(parse_count(part, what, 1, maximum))
        except SettingError:
            raise ReshardingError(
                f"{what} {text!r}: each size must be from 1 to {maximum}, got {part}"
            ) from None
    return tuple(sizes)


def plan_text(
    mesh: str,
    shape: str,
    source: str,
    target: str,
    dtype: str = "float32",
    explain: bool = False,
) -> str:
    """The explanation of the plan from ``source`` to ``target`` (see module docstring);
    ``explain``: with the candidate plans the cost model compared."""
    mesh_shape = _sizes(mesh, "--mesh", MAX_PLAN_DEVICES)
    if math.prod(mesh_shape) > MAX_PLAN_DEVICES:
        raise ReshardingError(
            f"--mesh {mesh!r}: {math.prod(mesh_shape)} devices; plan takes meshes of at most"
            f" {MAX_PLAN_DEVICES} devices"
        )
    extents = _sizes(shape, "--shape", MAX_EXTENT)
    device_mesh = Mesh(devices=tuple(range(math.prod(mesh_shape))), shape=mesh_shape)
    try:
        element = DType(dtype)
    except ValueError:
        known = ", ".join(d.value for d in DType)
        raise ReshardingError(f"--dtype {dtype!r}: expected one of {known}") from None
    values = []
    for name, notation in (("src", source), ("dst", target)):
        distribution = parse_notation(notation, device_mesh, ndim=len(extents))
        distribution.local_shape(extents)  # raises where an extent does not divide
        sharding = distribution.to_sharding(extents)
        values.append(
            TensorValue(
                name=name,
                dtype=element,
                shape=tuple(Const(value=e) for e in extents),
                sharding=sharding,
            )
        )
    return plan_resharding(*values).explain(candidates=explain)


def add_plan_command(subparsers: argparse._SubParsersAction) -> None:
    """``plan --mesh 2x2 --shape 8x8 --from S0S0 --to RR``: explain a redistribution plan."""
    parser = subparsers.add_parser(
        "plan",
        help="show a redistribution plan and its cost",
        description="Explain the plan that reshards a tensor between two distributions: one "
        "placement per mesh dim, outer first (S<dim>, R, P), e.g. --from S0S0 --to RR.",
    )
    parser.add_argument("--mesh", required=True, help="mesh shape, e.g. 2x2 or 2x2x2")
    parser.add_argument("--shape", required=True, help="tensor shape, e.g. 8x8")
    parser.add_argument("--from", dest="source", required=True, help="source, e.g. S0S0")
    parser.add_argument("--to", dest="target", required=True, help="target, e.g. RR")
    parser.add_argument("--dtype", default="float32", help="element type (default float32)")
    parser.add_argument(
        "--explain",
        action="store_true",
        help="also list the candidate plans compared (collective calls, bytes the busiest"
        " rank receives, temporaries) and why the chosen one won",
    )
    parser.set_defaults(handler=plan_command)


def plan_command(args: argparse.Namespace) -> int:
    """Prints the plan's explanation. Everything ``plan`` reads is an option, so a refusal
    (a bad size, notation or dtype, an extent that does not divide, distributions no plan
    connects) is a bad command line: a SettingError, exit code 2 (docs/cli.md)."""
    try:
        text = plan_text(args.mesh, args.shape, args.source, args.target, args.dtype, args.explain)
    except HostIrError as error:
        raise SettingError(str(error)) from error
    print(text)
    return 0
