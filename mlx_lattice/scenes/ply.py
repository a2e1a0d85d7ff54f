"""Point clouds and meshes from files: PLY (ASCII and binary) read and
write, and :func:`load_points` for ``.npy``, ``.ply`` and KITTI ``.bin``.
"""

from __future__ import annotations

import os

import numpy as np

from .mesh import mesh_surface_points

__all__ = ["load_ply", "save_ply", "load_points"]

_PLY_TYPES = {
    "char": "i1", "int8": "i1",
    "uchar": "u1", "uint8": "u1",
    "short": "i2", "int16": "i2",
    "ushort": "u2", "uint16": "u2",
    "int": "i4", "int32": "i4",
    "uint": "u4", "uint32": "u4",
    "float": "f4", "float32": "f4",
    "double": "f8", "float64": "f8",
}


def _ply_type(name):
    try:
        return _PLY_TYPES[name]
    except KeyError:
        raise ValueError(f"unknown PLY property type {name!r}") from None


def _parse_ply_header(fh):
    first = fh.readline().strip()
    if first != b"ply":
        raise ValueError("not a PLY file")
    fmt = None
    elements = []  # [name, count, [(prop, type) or (prop, (count_type, item_type))]]
    while True:
        line = fh.readline()
        if not line:
            raise ValueError("PLY header has no end_header")
        parts = line.decode("ascii", errors="replace").split()
        if not parts or parts[0] in ("comment", "obj_info"):
            continue
        if parts[0] == "end_header":
            break
        if parts[0] == "format":
            fmt = parts[1]
        elif parts[0] == "element":
            elements.append([parts[1], int(parts[2]), []])
        elif parts[0] == "property":
            if not elements:
                raise ValueError("PLY property before any element")
            if parts[1] == "list":
                elements[-1][2].append((parts[4], (_ply_type(parts[2]), _ply_type(parts[3]))))
            else:
                elements[-1][2].append((parts[2], _ply_type(parts[1])))
    if fmt not in ("ascii", "binary_little_endian", "binary_big_endian"):
        raise ValueError(f"unsupported PLY format {fmt!r}")
    return fmt, elements


def _read_binary_element(buf, pos, count, props, endian):
    """Decode one element block; returns (dict of columns, new position)."""
    if all(not isinstance(t, tuple) for _, t in props):
        dt = np.dtype([(name, endian + t) for name, t in props])
        arr = np.frombuffer(buf, dtype=dt, count=count, offset=pos)
        return {name: arr[name] for name, _ in props}, pos + count * dt.itemsize
    # Fast path: a single list whose length is the same on every row
    # (e.g. an all-triangle face element), possibly with scalars around it.
    if count > 0:
        guess = _fixed_list_dtype(buf, pos, props, endian)
        if guess is not None:
            dt, list_name, n_items = guess
            if pos + count * dt.itemsize <= len(buf):
                arr = np.frombuffer(buf, dtype=dt, count=count, offset=pos)
                if np.all(arr["__n"] == n_items):
                    cols = {name: arr[name] for name, t in props if not isinstance(t, tuple)}
                    cols[list_name] = [np.asarray(arr[list_name]).reshape(count, n_items)]
                    return cols, pos + count * dt.itemsize
    # General path: walk the rows one by one.
    cols = {name: [] for name, _ in props}
    for _ in range(count):
        for name, t in props:
            if isinstance(t, tuple):
                ct, it = (np.dtype(endian + x) for x in t)
                n = int(np.frombuffer(buf, dtype=ct, count=1, offset=pos)[0])
                pos += ct.itemsize
                cols[name].append(np.frombuffer(buf, dtype=it, count=n, offset=pos))
                pos += n * it.itemsize
            else:
                dt = np.dtype(endian + t)
                cols[name].append(np.frombuffer(buf, dtype=dt, count=1, offset=pos)[0])
                pos += dt.itemsize
    out = {}
    for name, t in props:
        out[name] = cols[name] if isinstance(t, tuple) else np.asarray(cols[name])
    return out, pos


def _fixed_list_dtype(buf, pos, props, endian):
    lists = [(name, t) for name, t in props if isinstance(t, tuple)]
    if len(lists) != 1:
        return None
    fields, offset = [], pos
    list_name, n_items = None, 0
    for name, t in props:
        if isinstance(t, tuple):
            ct, it = endian + t[0], endian + t[1]
            n_items = int(np.frombuffer(buf, dtype=ct, count=1, offset=offset)[0])
            fields += [("__n", ct), (name, it, (n_items,))]
            list_name = name
            offset += np.dtype(ct).itemsize + n_items * np.dtype(it).itemsize
        else:
            fields.append((name, endian + t))
            offset += np.dtype(t).itemsize
    return np.dtype(fields), list_name, n_items


def _read_ascii_element(lines, count, props):
    rows = [next(lines).split() for _ in range(count)]
    has_list = any(isinstance(t, tuple) for _, t in props)
    if not has_list:
        if count == 0:
            return {name: np.zeros(0, dtype=t) for name, t in props}
        arr = np.array(rows, dtype=np.float64)
        return {name: arr[:, k].astype(t) for k, (name, t) in enumerate(props)}
    lists = [k for k, (_, t) in enumerate(props) if isinstance(t, tuple)]
    if count and len(lists) == 1 and len({len(r) for r in rows}) == 1:
        # every row has the same length: decode the whole block at once
        arr = np.array(rows, dtype=np.float64)
        k = lists[0]
        n_items = int(arr[0, k])
        if np.all(arr[:, k] == n_items) and arr.shape[1] == len(props) + n_items:
            out, col = {}, 0
            for name, t in props:
                if isinstance(t, tuple):
                    out[name] = [arr[:, col + 1 : col + 1 + n_items].astype(t[1])]
                    col += 1 + n_items
                else:
                    out[name] = arr[:, col].astype(t)
                    col += 1
            return out
    cols = {name: [] for name, _ in props}
    for row in rows:
        k = 0
        for name, t in props:
            if isinstance(t, tuple):
                n = int(row[k])
                cols[name].append(np.array(row[k + 1 : k + 1 + n], dtype=np.float64).astype(t[1]))
                k += 1 + n
            else:
                cols[name].append(float(row[k]))
                k += 1
    return {name: (cols[name] if isinstance(t, tuple) else np.asarray(cols[name], dtype=t)) for name, t in props}


def _faces_from_lists(polys):
    """Triangulate a list of index arrays (or one (F, k) array) as fans."""
    if len(polys) == 1 and isinstance(polys[0], np.ndarray) and polys[0].ndim == 2:
        block = polys[0].astype(np.int64)
        k = block.shape[1]
        if k < 3:
            return np.zeros((0, 3), dtype=np.int64)
        return np.concatenate([block[:, [0, i, i + 1]] for i in range(1, k - 1)])
    tris = []
    for p in polys:
        p = np.asarray(p, dtype=np.int64)
        for i in range(1, len(p) - 1):
            tris.append((p[0], p[i], p[i + 1]))
    return np.asarray(tris, dtype=np.int64).reshape(-1, 3)


def load_ply(path):
    """Read a PLY file (ascii, binary little or big endian).

    Returns ``(vertices (V, 3) float64, faces (F, 3) int64 or None)``.
    Extra vertex properties (normals, colours, ...) and other elements are
    skipped; polygons with more than three corners are fan-triangulated.
    """
    with open(path, "rb") as fh:
        fmt, elements = _parse_ply_header(fh)
        body = fh.read()
    data = {}
    if fmt == "ascii":
        lines = iter(ln for ln in body.decode("ascii", errors="replace").splitlines() if ln.strip())
        for name, count, props in elements:
            data[name] = _read_ascii_element(lines, count, props)
    else:
        endian = "<" if fmt == "binary_little_endian" else ">"
        pos = 0
        for name, count, props in elements:
            data[name], pos = _read_binary_element(body, pos, count, props, endian)
    if "vertex" not in data:
        raise ValueError("PLY file has no vertex element")
    vert = data["vertex"]
    try:
        vertices = np.stack([np.asarray(vert[k], dtype=np.float64) for k in ("x", "y", "z")], axis=1)
    except KeyError:
        raise ValueError("PLY vertex element lacks x, y, z") from None
    faces = None
    face_el = data.get("face")
    if face_el is not None:
        face_props = next(props for name, _, props in elements if name == "face")
        list_names = [n for n, t in face_props if isinstance(t, tuple)]
        pick = next((n for n in ("vertex_indices", "vertex_index") if n in list_names), None)
        pick = pick or (list_names[0] if list_names else None)
        if pick is not None:
            faces = _faces_from_lists(face_el[pick])
            if len(faces) == 0:
                faces = None
            elif faces.min() < 0 or faces.max() >= len(vertices):
                raise ValueError("PLY face index out of range")
    return vertices, faces


def save_ply(path, vertices, faces=None, binary=True):
    """Write vertices (float32) and optional triangles (uchar count, int index)."""
    v = np.asarray(vertices, dtype=np.float32)[:, :3]
    f = None if faces is None else np.asarray(faces, dtype=np.int32)
    fmt = "binary_little_endian" if binary else "ascii"
    header = ["ply", f"format {fmt} 1.0", f"element vertex {len(v)}",
              "property float x", "property float y", "property float z"]
    if f is not None:
        header += [f"element face {len(f)}", "property list uchar int vertex_indices"]
    header.append("end_header")
    with open(path, "wb") as fh:
        fh.write(("\n".join(header) + "\n").encode("ascii"))
        if binary:
            fh.write(v.astype("<f4").tobytes())
            if f is not None:
                rec = np.zeros(len(f), dtype=[("n", "u1"), ("i", "<i4", (f.shape[1],))])
                rec["n"] = f.shape[1]
                rec["i"] = f
                fh.write(rec.tobytes())
        else:
            lines = [" ".join(repr(float(x)) for x in row) for row in v]
            if f is not None:
                lines += [f"{len(row)} " + " ".join(str(int(i)) for i in row) for row in f]
            fh.write(("\n".join(lines) + "\n").encode("ascii"))


def load_points(path, n_points=200_000, seed=0):
    """Load a point cloud as (N, 3) float32.

    * ``.npy``: an (N, 3+) array; extra columns are dropped.
    * ``.ply``: the vertices, or -- when the file has faces -- ``n_points``
      area-weighted samples of the surface.
    * ``.bin``: KITTI Velodyne scans (float32 x, y, z, reflectance).
    """
    ext = os.path.splitext(os.fspath(path))[1].lower()
    if ext == ".npy":
        arr = np.load(path)
        if arr.ndim != 2 or arr.shape[1] < 3:
            raise ValueError(f"expected an (N, 3+) array in {path}, got {arr.shape}")
        return np.ascontiguousarray(arr[:, :3], dtype=np.float32)
    if ext == ".ply":
        vertices, faces = load_ply(path)
        if faces is not None:
            return mesh_surface_points(vertices, faces, n_points, seed=seed)
        return vertices.astype(np.float32)
    if ext == ".bin":
        arr = np.fromfile(path, dtype="<f4")
        if arr.size % 4:
            raise ValueError(f"{path} is not a float32 x4 point file")
        return np.ascontiguousarray(arr.reshape(-1, 4)[:, :3])
    raise ValueError(f"unsupported point file type {ext!r} (use .npy, .ply or .bin)")
