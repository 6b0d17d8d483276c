"""The generative model behind ``glyphs``: alphabets -> characters -> drawings -> pixels.

Three levels of randomness, each from its own key, mirror how Omniglot came about:

1. An **alphabet style** (:func:`sample_style`): a set of anchor points the alphabet's strokes
   run between, how many strokes its characters tend to have, which stroke kinds it prefers
   (lines, bends, S-curves, loops, dots), how curly its curves are, how often a stroke starts
   on the previous one, its slant, aspect ratio and pen width.
2. A **character** (:func:`sample_characters`): 1-4 strokes, each a cubic Bezier curve (lines
   and quadratics are written as cubics so every stroke has the same four control points),
   normalised to fill the character box.
3. A **drawing** (:func:`sample_drawings`): one person's attempt at the character: every
   control point wobbles, every stroke shifts a little, the whole character gets a small
   rotation, shear, scale and translation, and the pen width varies.

:func:`render` turns control points into anti-aliased images with plain tensor ops: points
sampled densely along every curve, the distance from each pixel to the nearest point, and a
one-pixel linear ramp at the stroke's edge (an approximation of the pixel area the pen covers).
Coordinates are "character units": the character box is about ``[-0.8, 0.8]^2`` and one unit
is ``image_size * 10.5 / 28`` pixels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .. import random

MAX_STROKES = 4
POINTS_PER_STROKE = 64
LINE, BEND, CURVE, LOOP, DOT = range(5)
# Prior weight of each stroke kind before an alphabet re-weights it (lines and bends are the
# bread and butter of scripts; loops and dots are seasoning).
_KIND_PRIOR = (1.0, 1.0, 0.8, 0.3, 0.15)
_BOX = 0.8  # half-size of the box a character is normalised to
_UNIT_PX = 10.5 / 28  # pixels per character unit, as a fraction of the image size


@dataclass(frozen=True)
class Noise:
    """How much one drawing of a character varies (standard deviations, character units).

    The defaults are calibrated (see docs/data.md): pixel-space 1-nearest-neighbour scores
    in Omniglot's range on 5-way 1-shot, while the characters stay recognisable.
    """

    point: float = 0.045  # every control point
    stroke: float = 0.035  # every stroke as a whole
    rotation: float = 0.14  # radians
    shear: float = 0.14
    scale: float = 0.11  # log scale, both axes
    stretch: float = 0.07  # log aspect change
    shift: float = 0.12  # translation of the whole character
    width: float = 0.10  # log pen width


@dataclass(frozen=True)
class Style:
    """One alphabet's style; see the module docstring."""

    anchors: Tensor  # (A, 2)
    stroke_count_probs: Tensor  # (MAX_STROKES,) for 1..4 strokes
    kind_probs: Tensor  # (5,) over LINE..DOT
    curvature: float
    connect_prob: float
    slant: float
    aspect: float
    pen: float  # half pen width in pixels at 28x28


def _categorical(key: Tensor, probs: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Indices drawn from ``probs`` (last axis), shape ``shape``."""
    u = random.uniform(key, shape)[..., None]
    return (u >= probs.cumsum(-1)[:-1]).sum(-1)


def sample_style(key: Tensor) -> Style:
    """Draw one alphabet's style."""
    k = random.split(key, 6)
    u = random.uniform(k[0], (8,))
    n_anchors = 5 + int(u[0] * 8)  # 5..12
    anchors = random.uniform(k[1], (n_anchors, 2), low=-0.9, high=0.9)
    mean_strokes = 1.8 + 1.7 * float(u[1])
    counts = torch.arange(1, MAX_STROKES + 1, dtype=torch.float32)
    count_w = torch.exp(-0.5 * ((counts - mean_strokes) / 0.8) ** 2)
    kind_w = random.uniform(k[2], (5,)) ** 2 * torch.tensor(_KIND_PRIOR)
    kind_w[DOT] *= float(u[2] < 0.4)  # most scripts have no dots at all
    kind_w[LINE] += 0.05
    return Style(
        anchors=anchors,
        stroke_count_probs=count_w / count_w.sum(),
        kind_probs=kind_w / kind_w.sum(),
        curvature=0.15 + 0.55 * float(u[3]),
        connect_prob=0.2 + 0.6 * float(u[4]),
        slant=-0.25 + 0.5 * float(u[5]),
        aspect=math.exp(-0.2 + 0.4 * float(u[6])),
        pen=0.7 + 0.4 * float(u[7]),
    )


def _basis(t: Tensor) -> Tensor:
    """Bernstein weights of a cubic: ``t (...)`` -> ``(..., 4)``."""
    s = 1 - t
    return torch.stack([s**3, 3 * s**2 * t, 3 * s * t**2, t**3], dim=-1)


def bezier(ctrl: Tensor, t: Tensor) -> Tensor:
    """Cubic Bezier points: ctrl ``(..., 4, 2)``, t ``(T,)`` -> ``(..., T, 2)``."""
    return torch.einsum("tk,...kd->...td", _basis(t), ctrl)


def _rot(v: Tensor, angle: Tensor) -> Tensor:
    c, s = torch.cos(angle)[..., None], torch.sin(angle)[..., None]
    return torch.cat([c * v[..., :1] - s * v[..., 1:], s * v[..., :1] + c * v[..., 1:]], -1)


def sample_characters(key: Tensor, style: Style, n: int) -> tuple[Tensor, Tensor]:
    """Draw ``n`` characters of one alphabet.

    Returns:
        ctrl: ``(n, MAX_STROKES, 4, 2)`` control points, normalised to the character box.
        active: ``(n, MAX_STROKES)`` bool, which strokes exist (the first 1-4).
    """
    S = MAX_STROKES
    k = random.split(key, 10)
    count = _categorical(k[0], style.stroke_count_probs, (n,)) + 1
    active = torch.arange(S)[None, :] < count[:, None]
    kind = _categorical(k[1], style.kind_probs, (n, S))
    # A lone straight line or dot is no character: make it a curve.
    plain = (count == 1) & ((kind[:, 0] == LINE) | (kind[:, 0] == DOT))
    kind[:, 0] = torch.where(plain, CURVE, kind[:, 0])
    a = style.anchors.shape[0]
    start = random.randint(k[2], (n, S), 0, a)
    end = (start + random.randint(k[3], (n, S), 1, a)) % a  # a different anchor
    p0 = style.anchors[start] + 0.08 * random.normal(k[4], (n, S, 2))
    p3 = style.anchors[end] + 0.08 * random.normal(k[5], (n, S, 2))
    bend = style.curvature * random.normal(k[6], (n, S, 2)) * 1.2
    connect = random.uniform(k[7], (n, S)) < style.connect_prob
    on_prev = random.uniform(k[8], (n, S))
    loop = random.uniform(k[9], (n, S, 2))  # loop direction and size

    strokes: list[Tensor] = []
    for s in range(S):
        start_s = p0[:, s]
        if s > 0:  # start on the previous stroke, as a pen often does
            joint = (_basis(on_prev[:, s])[:, :, None] * strokes[-1]).sum(1)  # (n, 2)
            start_s = torch.where(connect[:, s, None], joint, start_s)
        end_s = p3[:, s]
        chord = end_s - start_s
        perp = torch.stack([-chord[:, 1], chord[:, 0]], -1)
        line = [start_s, start_s + chord / 3, start_s + 2 * chord / 3, end_s]
        apex = (start_s + end_s) / 2 + perp * bend[:, s, :1]
        bent = [start_s, start_s + 2 / 3 * (apex - start_s), end_s + 2 / 3 * (apex - end_s), end_s]
        curve = [start_s, line[1] + perp * bend[:, s, :1], line[2] + perp * bend[:, s, 1:], end_s]
        radius = 0.5 + 0.6 * loop[:, s, 1:]  # (n, 1)
        heading = 2 * math.pi * loop[:, s, 0]
        unit = torch.stack([torch.cos(heading), torch.sin(heading)], -1)
        looped = [
            start_s,
            start_s + radius * _rot(unit, torch.full_like(heading, 0.7)),
            start_s + radius * _rot(unit, torch.full_like(heading, -0.7)),
            start_s,
        ]
        dot = [start_s] * 4
        options = torch.stack(
            [torch.stack(c, 1) for c in (line, bent, curve, looped, dot)], 1
        )  # (n, 5, 4, 2)
        strokes.append(options[torch.arange(n), kind[:, s]])
    ctrl = torch.stack(strokes, 1)  # (n, S, 4, 2)
    return _normalise(ctrl, active, style), active


def _normalise(ctrl: Tensor, active: Tensor, style: Style) -> Tensor:
    """Centre each character's drawn extent and scale it to the box; then slant it."""
    pts = bezier(ctrl, torch.linspace(0, 1, 16))  # (n, S, 16, 2)
    mask = active[:, :, None, None]
    lo = torch.where(mask, pts, torch.inf).amin(dim=(1, 2))  # (n, 2)
    hi = torch.where(mask, pts, -torch.inf).amax(dim=(1, 2))
    centre = (lo + hi) / 2
    extent = (hi - lo).amax(-1)
    scale = (2 * _BOX / extent.clamp_min(1e-3)).clamp(max=3.0)
    ctrl = (ctrl - centre[:, None, None]) * scale[:, None, None, None]
    x, y = ctrl[..., 0], ctrl[..., 1]
    return torch.stack([style.aspect * x + style.slant * y, y / style.aspect], -1)


def sample_drawings(
    key: Tensor, ctrl: Tensor, style: Style, drawers: int, noise: Noise
) -> tuple[Tensor, Tensor]:
    """``drawers`` perturbed drawings of every character.

    Arguments:
        ctrl: ``(n, S, 4, 2)`` characters from :func:`sample_characters`.
    Returns:
        ctrl: ``(n, drawers, S, 4, 2)``; pen: ``(n, drawers)`` half widths in pixels at 28x28.
    """
    n, S = ctrl.shape[:2]
    k = random.split(key, 4)
    pts = ctrl[:, None] + noise.point * random.normal(k[0], (n, drawers, S, 4, 2))
    pts = pts + noise.stroke * random.normal(k[1], (n, drawers, S, 1, 2))
    z = random.normal(k[2], (6, n, drawers))
    rotation, shear = noise.rotation * z[0], noise.shear * z[1]
    scale = torch.exp(noise.scale * z[2])
    stretch = torch.exp(noise.stretch * z[3])
    sx, sy = scale * stretch, scale / stretch
    c, s = torch.cos(rotation), torch.sin(rotation)
    # A = R(rotation) @ Shear(shear) @ diag(sx, sy), one 2x2 matrix per drawing.
    affine = torch.stack(
        [
            torch.stack([c * sx, (c * shear - s) * sy], -1),
            torch.stack([s * sx, (s * shear + c) * sy], -1),
        ],
        -2,
    )  # (n, drawers, 2, 2)
    shift = noise.shift * z[4:6].permute(1, 2, 0)  # (n, drawers, 2)
    pts = torch.einsum("ndij,ndskj->ndski", affine, pts) + shift[:, :, None, None]
    pen = style.pen * torch.exp(noise.width * random.normal(k[3], (n, drawers)))
    return pts, pen


def render(
    ctrl: Tensor, active: Tensor, pen: Tensor, image_size: int, *, chunk: int = 2048
) -> Tensor:
    """Anti-aliased images of drawings.

    Every existing stroke is sampled at ``POINTS_PER_STROKE`` points; each point writes its
    squared distance into the few pixels within pen reach (a ``w x w`` window) with a
    scatter-min, so the cost is ``points * w**2`` per image instead of ``points * H * W``, and
    every pixel the pen can reach gets exactly the distance to its nearest curve point.

    Arguments:
        ctrl: ``(B, S, 4, 2)`` control points in character units.
        active: ``(B, S)`` which strokes to draw.
        pen: ``(B,)`` half pen widths in pixels at 28x28 (scaled with ``image_size``).
    Returns:
        ``(B, image_size, image_size)`` float32 ink in ``[0, 1]``.
    """
    size, B = image_size, ctrl.shape[0]
    t = torch.linspace(0, 1, POINTS_PER_STROKE)
    pts = (size - 1) / 2 + size * _UNIT_PX * bezier(ctrl[active], t)  # (M, T, 2): x=col, y=row
    owner = torch.arange(B)[:, None].expand_as(active)[active]  # (M,) image of each stroke
    half = pen * (size / 28)
    reach = float(half.max()) + 0.5 if B else 0.5  # ink ends at half + 0.5
    offsets = torch.arange(math.floor(2 * reach) + 1, dtype=torch.float32)  # (w,)
    dist2 = torch.full((B * size * size + 1,), torch.inf)  # the last slot takes off-image writes
    for i in range(0, pts.shape[0], chunk):
        p = pts[i : i + chunk]  # (m, T, 2)
        idx = torch.ceil(p - reach)[..., None] + offsets  # (m, T, 2, w) pixel coordinates
        d = (idx - p[..., None]) ** 2
        d2 = d[:, :, 1, :, None] + d[:, :, 0, None, :]  # (m, T, w, w) rows x columns
        inside = (idx >= 0) & (idx < size)
        ok = inside[:, :, 1, :, None] & inside[:, :, 0, None, :]
        li = idx.long()
        image = owner[i : i + chunk, None, None, None]
        flat = (image * size + li[:, :, 1, :, None]) * size + li[:, :, 0, None, :]
        flat = torch.where(ok, flat, B * size * size)
        dist2.scatter_reduce_(0, flat.flatten(), d2.flatten(), "amin")
    dist = dist2[:-1].reshape(B, size, size).sqrt()
    return (half[:, None, None] + 0.5 - dist).clamp(0, 1)
