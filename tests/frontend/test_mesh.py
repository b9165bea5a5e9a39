"""DeviceMesh: construction, queries (coordinates, index, team, teams), equality, errors.

Expected coordinates and teams are written out by hand from the row-major
definition (``mesh_x`` is the last mesh dim, ``mesh_y`` the second to last,
``mesh_z`` the third to last), never computed by the library.
"""

from __future__ import annotations

import pytest
import torch

import hostir
from frontend import DeviceMesh, MeshError, ParallelType

X = ParallelType.mesh_x
Y = ParallelType.mesh_y
Z = ParallelType.mesh_z


# ----- construction -----


@pytest.mark.parametrize(
    "devices",
    [torch.arange(4), [0, 1, 2, 3], (0, 1, 2, 3), range(4)],
    ids=["tensor", "list", "tuple", "range"],
)
def test_1d_construction(devices):
    """A 1-d mesh can be made from a tensor, a list, a tuple or a range."""
    mesh = DeviceMesh(devices)
    assert mesh.size == 4
    assert mesh.shape == (4,)
    assert mesh.ndim == 1
    assert mesh.devices == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "devices",
    [torch.arange(8).reshape(2, 4), [[0, 1, 2, 3], [4, 5, 6, 7]], ((0, 1, 2, 3), (4, 5, 6, 7))],
    ids=["tensor", "nested-list", "nested-tuple"],
)
def test_2d_construction(devices):
    """A 2-d mesh can be made from a 2-d tensor or nested lists/tuples; devices are row-major."""
    mesh = DeviceMesh(devices)
    assert mesh.size == 8
    assert tuple(mesh.shape) == (2, 4)
    assert mesh.ndim == 2
    assert mesh.devices == [0, 1, 2, 3, 4, 5, 6, 7]


def test_3d_construction_from_nested_list():
    """A 3-d nested list gives a 2x2x2 mesh with its devices flattened row-major."""
    mesh = DeviceMesh([[[7, 6], [5, 4]], [[3, 2], [1, 0]]])
    assert mesh.size == 8
    assert tuple(mesh.shape) == (2, 2, 2)
    assert mesh.ndim == 3
    assert mesh.devices == [7, 6, 5, 4, 3, 2, 1, 0]


def test_int32_tensor_gives_python_ints():
    """Devices of an int32 tensor come back as plain Python ints."""
    mesh = DeviceMesh(torch.tensor([[3, 1], [0, 2]], dtype=torch.int32))
    assert mesh.devices == [3, 1, 0, 2]
    assert all(type(d) is int for d in mesh.devices)


def test_subset_and_unordered_devices():
    """A mesh may name any subset of ranks in any order."""
    mesh = DeviceMesh([5, 2, 9])
    assert mesh.devices == [5, 2, 9]
    assert mesh.size == 3
    assert 2 in mesh
    assert 0 not in mesh


def test_devices_is_a_copy():
    """Mutating the returned device list does not change the mesh."""
    mesh = DeviceMesh([0, 1])
    mesh.devices.append(7)
    assert mesh.devices == [0, 1]


# ----- coordinates and index -----


def test_coordinates_and_index_1d_unordered():
    """On a 1-d mesh a device's coordinate is its position in the device list."""
    mesh = DeviceMesh([3, 1, 0, 2])
    for position, device in enumerate([3, 1, 0, 2]):
        assert tuple(mesh.coordinates(device)) == (position,)
        assert mesh.index(device) == position
        assert mesh.index(device, X) == position


def test_coordinates_and_index_2x4():
    """On the 2x4 mesh device d sits at (d // 4, d % 4); mesh_x is the column, mesh_y the row."""
    mesh = DeviceMesh(torch.arange(8).reshape(2, 4))
    for device in range(8):
        assert tuple(mesh.coordinates(device)) == (device // 4, device % 4)
        assert mesh.index(device, X) == device % 4
        assert mesh.index(device, Y) == device // 4
    assert mesh.index(6) == 2  # mesh_x is the default


def test_coordinates_and_index_unordered_2x2():
    """Coordinates follow the position in the nested list, not the device id."""
    mesh = DeviceMesh([[2, 0], [3, 1]])
    expected = {2: (0, 0), 0: (0, 1), 3: (1, 0), 1: (1, 1)}
    for device, coords in expected.items():
        assert tuple(mesh.coordinates(device)) == coords
        assert mesh.index(device, Y) == coords[0]
        assert mesh.index(device, X) == coords[1]


def test_coordinates_and_index_2x2x2():
    """On a 2x2x2 mesh mesh_z is dim 0, mesh_y dim 1 and mesh_x dim 2."""
    mesh = DeviceMesh(torch.arange(8).reshape(2, 2, 2))
    for device in range(8):
        z, y, x = device // 4, (device // 2) % 2, device % 2
        assert tuple(mesh.coordinates(device)) == (z, y, x)
        assert (mesh.index(device, Z), mesh.index(device, Y), mesh.index(device, X)) == (z, y, x)


# ----- teams -----


def test_teams_1d():
    """A 1-d mesh has one mesh_x team: all its devices, in mesh order."""
    mesh = DeviceMesh([3, 1, 0, 2])
    assert mesh.team(0) == [3, 1, 0, 2]
    assert mesh.teams(X) == [[3, 1, 0, 2]]


def test_teams_2x4():
    """mesh_x teams of the 2x4 mesh are its rows, mesh_y teams its columns."""
    mesh = DeviceMesh(torch.arange(8).reshape(2, 4))
    rows = [[0, 1, 2, 3], [4, 5, 6, 7]]
    columns = [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert mesh.teams(X) == rows
    assert mesh.teams() == rows
    assert mesh.teams(Y) == columns
    for device in range(8):
        assert mesh.team(device, X) == rows[device // 4]
        assert mesh.team(device, Y) == columns[device % 4]


def test_teams_unordered_2x2():
    """Teams of [[2, 0], [3, 1]] keep mesh order inside each group."""
    mesh = DeviceMesh([[2, 0], [3, 1]])
    assert mesh.teams(X) == [[2, 0], [3, 1]]
    assert mesh.teams(Y) == [[2, 3], [0, 1]]
    assert mesh.team(1, X) == [3, 1]
    assert mesh.team(1, Y) == [0, 1]


def test_teams_2x2x2():
    """On a 2x2x2 mesh each team varies one coordinate and fixes the other two."""
    mesh = DeviceMesh(torch.arange(8).reshape(2, 2, 2))
    assert mesh.teams(X) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert mesh.teams(Y) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert mesh.teams(Z) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert mesh.team(7, X) == [6, 7]
    assert mesh.team(7, Y) == [5, 7]
    assert mesh.team(7, Z) == [3, 7]


def test_teams_partition_the_mesh():
    """For every axis of a 2x3x2 mesh the teams are disjoint and cover every device once."""
    mesh = DeviceMesh(torch.arange(12).reshape(2, 3, 2))
    sizes = {X: 2, Y: 3, Z: 2}
    for parallel_type, size in sizes.items():
        teams = mesh.teams(parallel_type)
        assert len(teams) == 12 // size
        assert all(len(team) == size for team in teams)
        assert sorted(d for team in teams for d in team) == list(range(12))


# ----- equality and hashing -----


def test_equality_and_hash():
    """Meshes with the same devices and shape are equal and hash alike, whatever the source."""
    a = DeviceMesh(torch.arange(4))
    b = DeviceMesh([0, 1, 2, 3])
    c = DeviceMesh(range(4))
    assert a == b == c
    assert hash(a) == hash(b) == hash(c)
    assert len({a, b, c}) == 1
    assert {a: "mesh"}[c] == "mesh"


def test_inequality():
    """Device order, shape and device set all distinguish meshes; a list is not a mesh."""
    mesh = DeviceMesh([0, 1, 2, 3])
    assert mesh != DeviceMesh([1, 0, 2, 3])
    assert mesh != DeviceMesh([[0, 1], [2, 3]])
    assert mesh != DeviceMesh([0, 1, 2, 4])
    assert mesh != [0, 1, 2, 3]


# ----- DeviceMesh.shard_tensor -----


def test_shard_tensor_1d():
    """DeviceMesh.shard_tensor splits a dim into contiguous blocks, block i on mesh position i."""
    mesh = DeviceMesh([3, 1, 0, 2])
    t = torch.arange(24).reshape(2, 12)
    for position, rank in enumerate([3, 1, 0, 2]):
        piece = mesh.shard_tensor(t, 1, rank=rank)
        expected = t[:, [position * 3 + j for j in range(3)]]
        assert torch.equal(piece, expected)
        assert piece.is_contiguous()


def test_shard_tensor_negative_dim():
    """A negative dim counts from the end."""
    mesh = DeviceMesh([0, 1])
    t = torch.arange(8).reshape(2, 4)
    assert torch.equal(mesh.shard_tensor(t, -1, rank=1), torch.tensor([[2, 3], [6, 7]]))


def test_shard_tensor_along_mesh_y():
    """Sharding along mesh_y of a 2x3 mesh gives each row of the mesh one block."""
    mesh = DeviceMesh(torch.arange(6).reshape(2, 3))
    t = torch.randn(4, 5)
    for rank in range(6):
        row = rank // 3
        piece = mesh.shard_tensor(t, 0, rank=rank, parallel_type=Y)
        assert torch.equal(piece, t[[2 * row, 2 * row + 1]])
    # mesh_x of the same mesh: 3 blocks along dim 1 of a 4x6 tensor
    t = torch.arange(24).reshape(4, 6)
    for rank in range(6):
        column = rank % 3
        piece = mesh.shard_tensor(t, 1, rank=rank)
        assert torch.equal(piece, t[:, [2 * column, 2 * column + 1]])


def test_shard_tensor_reassembles():
    """Concatenating the pieces of all ranks in mesh order gives back the tensor."""
    mesh = DeviceMesh([2, 0, 1])
    t = torch.randn(6, 2, dtype=torch.bfloat16)
    pieces = [mesh.shard_tensor(t, 0, rank=rank) for rank in mesh.devices]
    assert torch.equal(torch.cat(pieces), t)


def test_shard_tensor_errors():
    """Non-divisible extents and out-of-range dims raise MeshError naming dim and mesh."""
    mesh = DeviceMesh([0, 1])
    with pytest.raises(MeshError, match=r"dim 0 of extent 9.*2 devices"):
        mesh.shard_tensor(torch.arange(9), 0, rank=0)
    with pytest.raises(MeshError, match="dim 1"):
        mesh.shard_tensor(torch.arange(8), 1, rank=0)
    with pytest.raises(MeshError, match=r"mesh_y"):
        mesh.shard_tensor(torch.arange(8), 0, rank=0, parallel_type=Y)


# ----- errors -----


def test_mesh_error_hierarchy():
    """MeshError is importable from frontend and hostir and derives from HostIrError."""
    assert issubclass(MeshError, hostir.HostIrError)
    assert MeshError is hostir.MeshError


@pytest.mark.parametrize(
    ("devices", "pattern"),
    [
        ([0, 1, 1], r"distinct.*\[0, 1, 1\]"),
        ([[0, 1], [0, 2]], r"distinct.*\[0, 1, 0, 2\]"),
        ([0, -1], r"non-negative.*\[0, -1\]"),
        (torch.tensor([[0, 1], [-2, 2]]), r"non-negative.*-2"),
        (torch.arange(16).reshape(2, 2, 2, 2), r"1 to 3 dims.*\(2, 2, 2, 2\)"),
        ([], "at least one device"),
        (range(0), "at least one device"),
        (torch.tensor([], dtype=torch.int64), "at least one device"),
        ([0, 1.5], r"integers.*1\.5"),
        ([0, "1"], r"integers.*'1'"),
        ([True, False], "integers"),
        (torch.tensor([0.0, 1.0]), r"integers.*float"),
        ([[0, 1], [2]], r"same shape.*\[\[0, 1\], \[2\]\]"),
        ([[0, 1], 2], "integers"),
        (3, "tensor, list or range"),
    ],
    ids=[
        "duplicate",
        "duplicate-2d",
        "negative",
        "negative-tensor",
        "4d",
        "empty-list",
        "empty-range",
        "empty-tensor",
        "float",
        "string",
        "bool",
        "float-tensor",
        "ragged",
        "mixed-nesting",
        "scalar",
    ],
)
def test_invalid_mesh(devices, pattern):
    """An invalid device set raises MeshError naming the offending devices."""
    with pytest.raises(MeshError, match=pattern):
        DeviceMesh(devices)


@pytest.mark.parametrize("query", ["index", "team", "teams"])
def test_missing_mesh_axis(query):
    """Asking a 1-d mesh for mesh_y, or a 2-d one for mesh_z, raises MeshError naming both."""
    mesh_1d = DeviceMesh([0, 1])
    mesh_2d = DeviceMesh([[0, 1], [2, 3]])
    args_1d = () if query == "teams" else (0,)
    with pytest.raises(MeshError, match=r"\[0, 1\].*1-d.*mesh_y"):
        getattr(mesh_1d, query)(*args_1d, Y)
    with pytest.raises(MeshError, match=r"\[\[0, 1\], \[2, 3\]\].*2-d.*mesh_z"):
        getattr(mesh_2d, query)(*args_1d, Z)


@pytest.mark.parametrize("query", ["coordinates", "index", "team"])
def test_device_not_in_mesh(query):
    """Querying a device the mesh does not contain raises MeshError naming device and mesh."""
    mesh = DeviceMesh([1, 3])
    with pytest.raises(MeshError, match=r"device 2 .*\[1, 3\]"):
        getattr(mesh, query)(2)


def test_non_mesh_parallel_type():
    """A team query with a non-mesh parallel type raises a HostIrError naming the type."""
    mesh = DeviceMesh([0, 1])
    with pytest.raises(hostir.HostIrError, match="stream"):
        mesh.team(0, ParallelType.stream)
