"""spconv 2.x on the same GPU, in the same process, for the GPU bench's
side-by-side columns: the same layers on the same coordinates and weights,
its map building, and the same MinkUNet built from spconv.pytorch modules
(layer list, channels, batch norms, ReLUs, concatenations as
mlx_lattice/models/minkunet.py) trained the same way (fp16, maps built
inside every step, forward + loss + backward + Adam).

Optional: ``available()`` is False without torch, spconv or a CUDA device,
and the bench then leaves the spconv columns out.
"""

from __future__ import annotations

import time

import numpy as np

# torch and spconv are optional dependencies: each function imports them on use.


def available() -> bool:
    try:
        import spconv.pytorch  # noqa: F401
        import torch
    except Exception:  # optional comparison: any import failure means absent
        return False
    return bool(torch.cuda.is_available())


def _torch_dtype(name: str):
    import torch

    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def best_time(fn, repeats: int) -> float:
    """Best wall-clock seconds of fn, the device synchronised around each call."""
    import torch

    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


class Grid:
    """Our (batch, x, y, z) coordinates as spconv indices: shifted to start at
    an even origin (strided grids keep their parity), int32 on the GPU."""

    def __init__(self, coords: np.ndarray):
        import torch

        coords = np.asarray(coords)
        self.lo = coords[:, 1:].min(0) // 2 * 2
        idx = coords.astype(np.int32).copy()
        idx[:, 1:] -= self.lo
        self.shape = (idx[:, 1:].max(0) + 4).tolist()
        self.batch = int(idx[:, 0].max()) + 1
        self.indices = torch.from_numpy(idx).cuda()

    def tensor(self, feats):
        import spconv.pytorch as spconv

        return spconv.SparseConvTensor(feats, self.indices, self.shape, self.batch)


def layer_times(coords, kind: str, k: int, c_in: int, c_out: int, w5: np.ndarray, x: np.ndarray,
                dtype: str, repeats: int) -> dict:
    """spconv's times for one layer, maps cached: forward, forward + backward
    (input and weight gradients), and its forward output for a correctness
    check. kind: subm (3x3x3), down (k2s2), up (the transposed k2s2 back onto
    the finer voxels). Its map building is timed by ``map_times``."""
    import spconv.pytorch as spconv
    import torch

    tdt = _torch_dtype(dtype)
    grid = Grid(coords)
    feats = torch.from_numpy(np.asarray(x, np.float32)).cuda().to(tdt)
    if kind == "subm":
        conv = spconv.SubMConv3d(c_in, c_out, k, bias=False, indice_key="s")
        pre = None
    elif kind == "down":
        conv = spconv.SparseConv3d(c_in, c_out, k, stride=2, bias=False, indice_key="d")
        pre = None
    else:
        pre = spconv.SparseConv3d(c_out, c_in, k, stride=2, bias=False, indice_key="d").cuda().to(tdt)
        conv = spconv.SparseInverseConv3d(c_in, c_out, k, bias=False, indice_key="d")
    conv = conv.cuda().to(tdt)
    with torch.no_grad():
        conv.weight.copy_(torch.from_numpy(np.asarray(w5, np.float32)).to(tdt))

    def source(f):
        t = grid.tensor(f if pre is None else torch.zeros((len(coords), c_out), dtype=tdt, device="cuda"))
        if pre is not None:
            with torch.no_grad():
                t = pre(t).replace_feature(f)
        return t

    with torch.no_grad():
        cached = source(feats)
        out = conv(cached)
        t_fwd = best_time(lambda: conv(cached), repeats)
    fg = feats.clone().requires_grad_(True)
    ct = torch.randn(out.features.shape, dtype=tdt, device="cuda")

    def fwd_bwd():
        conv.weight.grad = None
        fg.grad = None
        conv(cached.replace_feature(fg)).features.backward(ct)

    t_fb = best_time(fwd_bwd, repeats)
    return {
        "forward_s": t_fwd, "fwd_bwd_s": t_fb,
        "out_indices": out.indices.cpu().numpy(), "out": out.features.float().cpu().numpy(),
        "lo": grid.lo,
    }


def map_times(coords, repeats: int) -> dict:
    """spconv's own map building on the GPU (``get_indice_pairs_implicit_gemm``,
    the maps its fp16 layers use, training form) per geometry name."""
    import torch
    from spconv.core import ConvAlgo
    from spconv.pytorch import ops as spops

    grid = Grid(coords)
    out = {}
    for name, ks, stride, pad in (("subm k3", 3, 1, 1), ("down k2s2", 2, 2, 0), ("down k3s2", 3, 2, 1)):
        subm = stride == 1

        def build():
            return spops.get_indice_pairs_implicit_gemm(
                grid.indices, grid.batch, grid.shape, ConvAlgo.MaskImplicitGemm, [ks] * 3, [stride] * 3,
                [pad] * 3, [1] * 3, [0] * 3, subm, False, True)

        out[name] = best_time(build, repeats)
    torch.cuda.synchronize()
    return out


def minkunet(in_channels: int, num_classes: int, width: float):
    """MinkUNet (mlx_lattice.models.MinkUNet's layout) from spconv.pytorch modules."""
    import spconv.pytorch as spconv
    import torch
    from torch import nn

    base = (32, 32, 64, 128, 256, 256, 128, 96, 96)
    cs = [max(1, int(round(width * c))) for c in base]

    class Block(nn.Module):
        def __init__(self, conv, c):
            super().__init__()
            self.conv, self.norm = conv, nn.BatchNorm1d(c)

        def forward(self, x):
            y = self.conv(x)
            return y.replace_feature(torch.relu(self.norm(y.features)))

    class Residual(nn.Module):
        def __init__(self, a, b, key):
            super().__init__()
            self.conv1 = spconv.SubMConv3d(a, b, 3, bias=False, indice_key=key)
            self.norm1 = nn.BatchNorm1d(b)
            self.conv2 = spconv.SubMConv3d(b, b, 3, bias=False, indice_key=key)
            self.norm2 = nn.BatchNorm1d(b)
            self.shortcut = nn.Sequential(nn.Linear(a, b, bias=False), nn.BatchNorm1d(b)) if a != b else None

        def forward(self, x):
            h = self.conv1(x)
            h = h.replace_feature(torch.relu(self.norm1(h.features)))
            h = self.conv2(h)
            skip = x.features if self.shortcut is None else self.shortcut(x.features)
            return h.replace_feature(torch.relu(self.norm2(h.features) + skip))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.ModuleList([
                Block(spconv.SubMConv3d(in_channels, cs[0], 3, bias=False, indice_key="subm0"), cs[0]),
                Block(spconv.SubMConv3d(cs[0], cs[0], 3, bias=False, indice_key="subm0"), cs[0]),
            ])
            self.encoder = nn.ModuleList([
                nn.ModuleList([
                    Block(spconv.SparseConv3d(cs[i], cs[i], 2, stride=2, bias=False, indice_key=f"down{i}"), cs[i]),
                    Residual(cs[i], cs[i + 1], f"subm{i + 1}"),
                    Residual(cs[i + 1], cs[i + 1], f"subm{i + 1}"),
                ])
                for i in range(4)
            ])
            ups, decs = [], []
            prev = cs[4]
            for j in range(4):
                o, skip = cs[5 + j], cs[3 - j]
                ups.append(Block(spconv.SparseInverseConv3d(prev, o, 2, bias=False, indice_key=f"down{3 - j}"), o))
                decs.append(nn.ModuleList([Residual(o + skip, o, f"subm{3 - j}"), Residual(o, o, f"subm{3 - j}")]))
                prev = o
            self.up, self.decoder = nn.ModuleList(ups), nn.ModuleList(decs)
            self.classifier = nn.Linear(cs[8], num_classes)

        def forward(self, x):
            for b in self.stem:
                x = b(x)
            skips = [x]
            for stage in self.encoder:
                y = skips[-1]
                for b in stage:
                    y = b(y)
                skips.append(y)
            y = skips.pop()
            for up, dec in zip(self.up, self.decoder):
                u = up(y)
                s = skips.pop()
                y = u.replace_feature(torch.cat([u.features, s.features], dim=1))
                for b in dec:
                    y = b(y)
            return self.classifier(y.features)

    return Net()


def network_step(coords, width: float, dtype: str, repeats: int, in_channels=4, num_classes=4, seed=2) -> dict:
    """spconv MinkUNet training step on the GPU, maps built inside every step
    (a fresh SparseConvTensor): best seconds and peak memory allocated."""
    import torch

    torch.manual_seed(seed)
    tdt = _torch_dtype(dtype)
    grid = Grid(coords)
    net = minkunet(in_channels, num_classes, width).cuda().to(tdt).train()
    feats = torch.from_numpy(
        np.random.default_rng(seed).standard_normal((len(coords), in_channels)).astype(np.float32)).cuda().to(tdt)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = (net(grid.tensor(feats)).float() ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    def synced():
        step()
        torch.cuda.synchronize()

    def loop(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n

    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t = best_time(step, repeats)
    peak = torch.cuda.max_memory_allocated()
    # step_s times the host's calls (torch queues the GPU's work and runs
    # ahead until a map's host read waits for it); sync_step_s waits for
    # each step's work; loop_s is a loop of steps, waited for once.
    return {"step_s": t, "peak_bytes": peak, "sync_step_s": best_time(synced, repeats),
            "loop_s": min(loop(max(repeats, 5)) for _ in range(2))}
