"""``patterns``: an embedded, procedurally generated set of grayscale textures (28 px).

A **confirmation set**: glyphs is what defaults and settings are tuned on, and rgb-shapes has
been seen by the choice of defaults; patterns is made to be seen by no choice at all, so a
tuned default can be confirmed on data that nothing was picked on. Keep it that way: use it to
confirm, never to tune or to pick between settings.

Unlike glyphs, it has no strokes on blank paper but textures that fill (part of) the frame,
where what makes a class is a *distribution* of frequencies, orientations, phases and
waveforms, not a shape at a place. Nothing downloads: every split is generated from a seed
with funcgraph.random keys (a seed gives the same bytes on every run) and cached as
safetensors, as glyphs is. 1,000 classes of :data:`IMAGES_PER_CLASS` images, 1 x 28 x 28 by
default, uint8, split 600 / 200 / 200 into ``train``, ``val`` and ``test`` (disjoint: class
``c`` is drawn from its own key and belongs to one split; 20-way 5-shot tasks with 15 queries
fit every split).

**A class** is one of :data:`FAMILIES`, with its own parameters:

* ``grating``: a wave across the frame, ``wave(pi f x_theta + phi)`` with ``x_theta`` the
  coordinate in ``[-1, 1]`` across lines at angle ``theta`` (``f`` cycles per image);
* ``plaid``: the sum of two gratings at different angles and frequencies;
* ``checker``: their product;
* ``lattice``: dots on a (sheared) lattice of two basis vectors, of a class dot size;
* ``noise``: band-pass noise around a class frequency and orientation, of class bandwidths;
* ``waves``: a grating whose lines undulate (its phase modulated along the lines);
* ``rings``: rings or spirals (1-3 arms) around a class centre;

a waveform ``wave(s) = tanh(g (sin s - b))`` (``g`` from sine-like to square, ``b`` thin to
thick lines), a brightness and contrast, a window (the whole frame, a disc, or one side of a
line) with a flat level outside it, and pixel noise. Frequency, orientation and phase have a
class mean and a class spread: some classes loosely hold their phase, others draw it afresh
every image.

**An image** of the class is one draw of that distribution; besides, its window moves, its
brightness and contrast vary, and a stray grating of random frequency, orientation and phase
is laid over it (:class:`Variation` holds these shared amounts). The amounts are set so that
raw pixels are a weak cue: pixel-space 1-nearest-neighbour on 5-way 1-shot test tasks is far
below solved (docs/data.md has the command), while a conv net, which sees frequency and
orientation whatever the phase, has room to do much better.

``python -m funcgraph.data --dataset patterns --preview out.png --baseline 600`` writes a
preview grid and scores that baseline.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from .. import random
from ..errors import DataError
from .cache import generated_split
from .datasets import ClassDataset, check_split

GENERATOR_VERSION = 1
"""Bump whenever a change alters any pixel; it is part of the cache key."""

IMAGES_PER_CLASS = 20
"""Images of every class: Omniglot's 20, enough for 20-way 5-shot tasks with 15 queries."""

NUM_CLASSES = 1000
SPLITS: dict[str, range] = {"train": range(0, 600), "val": range(600, 800),
                            "test": range(800, NUM_CLASSES)}
"""Which class indices make up each split (disjoint)."""

FAMILIES = ("grating", "plaid", "checker", "lattice", "noise", "waves", "rings")
"""The texture families a class is drawn from (uniformly)."""

_STREAM = 0x7A77  # folded into the seed's key first, so no class shares a stream with rgb-shapes


@dataclass(frozen=True)
class Variation:
    """How much one image of a class differs from another, beyond its class's own spreads
    (standard deviations).

    Attributes:
        brightness: offset added to the whole image.
        contrast: log-scale of the texture's contrast.
        window_shift: move of the window's centre or edge (and of the rings' centre), in
            half-widths of the image.
        window_scale: log-scale of a disc window's radius.
        clutter: the largest amplitude, relative to the class contrast, of a stray grating
            of random frequency, orientation and phase laid over each image (uniform in
            ``[0, clutter]``).
    """

    brightness: float = 0.12
    contrast: float = 0.2
    window_shift: float = 0.08
    window_scale: float = 0.1
    clutter: float = 1.0


def _class_style(key: Tensor) -> dict[str, Tensor]:
    """The fixed parameters of one class (see the module docstring): all from one draw."""
    u = random.uniform(key, (25,))

    def lerp(i: int, lo: float, hi: float) -> Tensor:
        """Draw ``i``, uniform in ``[lo, hi)``."""
        return lo + (hi - lo) * u[i]

    def loglerp(i: int, lo: float, hi: float) -> Tensor:
        """Draw ``i``, log-uniform in ``[lo, hi)``."""
        return torch.exp(lerp(i, math.log(lo), math.log(hi)))

    return {
        "family": (u[0] * len(FAMILIES)).floor().clamp(max=len(FAMILIES) - 1),
        "freq": loglerp(1, 1.5, 6.0),  # cycles per image width
        "freq_spread": lerp(2, 0.05, 0.2),  # log-sd
        "angle": lerp(3, 0.0, math.pi),
        "angle_spread": lerp(4, 0.05, 0.4),  # radians
        "phase": lerp(5, 0.0, 2 * math.pi),
        "phase_spread": lerp(6, 1.0, 3.0),  # radians: from loosely held to drawn afresh
        "turn": lerp(7, math.pi / 6, math.pi / 2) * torch.where(u[8] < 0.5, -1.0, 1.0),
        "ratio": loglerp(9, 0.6, 1.6),  # second frequency / first
        "gain": loglerp(10, 0.7, 8.0),  # waveform: sine-like .. square
        "bias": lerp(11, -0.6, 0.6),  # waveform: thick .. thin lines
        "dot": lerp(12, 0.15, 0.35),  # lattice dot radius, in periods
        "bandwidth": lerp(13, 0.15, 0.4),  # noise: radial, as a fraction of the frequency
        "spread": lerp(14, 0.15, 0.8),  # noise: angular, radians; waves: amplitude / 3
        "arms": (u[15] * 4).floor(),  # rings: 0 (rings) .. 3 spiral arms
        "centre": torch.stack([lerp(16, -0.5, 0.5), lerp(17, -0.5, 0.5)]),
        "window": (u[18] * 4).floor().clamp(max=3),  # 0, 1: whole frame; 2: disc; 3: half
        "radius": lerp(19, 0.45, 0.85),  # disc: half-widths; half window: edge at r - 0.65
        "level": lerp(20, 0.35, 0.65),  # mean brightness of the texture
        "outside": lerp(21, 0.2, 0.8),  # brightness outside the window
        "contrast": lerp(22, 0.1, 0.4),
        "noise": lerp(23, 0.03, 0.15),  # pixel noise sd
        "tilt": lerp(24, 0.0, 2 * math.pi),  # half window: the direction its side faces
    }


def _class_keys(seed: int, index: int) -> tuple[Tensor, Tensor]:
    """Class ``index``'s keys: one for its parameters, one for its images."""
    style_key, image_key = random.split(random.fold_in(random.fold_in(random.key(seed),
                                                                      _STREAM), index), 2)
    return style_key, image_key


def _wave(s: Tensor, style: dict[str, Tensor]) -> Tensor:
    """The class waveform in ``(-1, 1)``: ``tanh(g (sin s - b))``."""
    return torch.tanh(style["gain"] * (torch.sin(s) - style["bias"]))


def _band_noise(white: Tensor, freq: Tensor, angle: Tensor, style: dict[str, Tensor]) -> Tensor:
    """``white`` (n, S, S) filtered to a band around ``freq`` (n,) cycles per image at
    ``angle`` (n,), then scaled to unit standard deviation per image."""
    size = white.shape[-1]
    k = torch.fft.fftfreq(size) * size  # cycles per image
    ky, kx = torch.meshgrid(k, k, indexing="ij")  # (S, S)
    radius = torch.sqrt(kx * kx + ky * ky)
    heading = torch.atan2(ky, kx)
    f, a = freq[:, None, None], angle[:, None, None]
    off = torch.remainder(heading - a + math.pi / 2, math.pi) - math.pi / 2  # both lobes
    gain = torch.exp(-0.5 * ((radius - f) / (style["bandwidth"] * f)) ** 2
                     - 0.5 * (off / style["spread"]) ** 2)  # (n, S, S)
    field = torch.fft.ifft2(torch.fft.fft2(white) * gain).real
    return field / field.std(dim=(-2, -1), keepdim=True).clamp(min=1e-6)


def render_class(
    seed: int, index: int, *, image_size: int = 28, count: int = IMAGES_PER_CLASS,
    variation: Variation | None = None,
) -> Tensor:
    """The images of class ``index``: ``(count, 1, image_size, image_size)`` float32 in
    ``[0, 1]``, quantised to multiples of 1/255 (what the cache stores)."""
    return _render(seed, index, image_size=image_size, count=count, variation=variation)[0]


def _grid(t: Tensor) -> Tensor:
    """``(n,) -> (n, 1, 1)``: one value per image, broadcast over its pixels."""
    return t[:, None, None]


@dataclass(frozen=True)
class _Canvas:
    """The pixel coordinates every image is drawn on, and the gratings laid on them.

    Attributes:
        x: (S, S) the column coordinate of each pixel centre, in ``[-1, 1]``.
        y: (S, S) the row coordinate, likewise.
    """

    x: Tensor
    y: Tensor

    @classmethod
    def of_size(cls, size: int) -> _Canvas:
        """The canvas of ``size`` x ``size`` pixels."""
        axis = (torch.arange(size, dtype=torch.float32) + 0.5) / size * 2 - 1
        y, x = torch.meshgrid(axis, axis, indexing="ij")  # (S, S) in [-1, 1]: rows, columns
        return cls(x=x, y=y)

    @property
    def size(self) -> int:
        """Pixels along each side."""
        return self.x.shape[-1]

    def along(self, a: Tensor) -> Tensor:
        """(n, S, S): the coordinate across lines at angle ``a`` (n,)."""
        return self.x * _grid(torch.cos(a)) + self.y * _grid(torch.sin(a))

    def grating(self, f: Tensor, a: Tensor, p: Tensor) -> Tensor:
        """(n, S, S): the phase of a grating of ``f`` cycles over the width 2, at angle ``a``
        and phase ``p`` (each (n,)), before the waveform."""
        return math.pi * _grid(f) * self.along(a) + _grid(p)


@dataclass(frozen=True)
class _Draw:
    """Each image's draw of its class's frequency, orientation and phase (n images).

    Attributes:
        freq: (n,) cycles per image of the first component.
        angle: (n,) its orientation, radians.
        phase: (n, 2) the phases of the two components.
        freq2: (n,) the second component's frequency (the class ratio times ``freq``).
        angle2: (n,) its orientation (the class turn from ``angle``).
        centre: (n, 2) the rings' centre (the class centre, moved).
    """

    freq: Tensor
    angle: Tensor
    phase: Tensor
    freq2: Tensor
    angle2: Tensor
    centre: Tensor

    @classmethod
    def of(cls, style: dict[str, Tensor], variation: Variation, nuisance: Tensor) -> _Draw:
        """The draw that the per-image normals ``nuisance[:, 0:6]`` make of ``style``."""
        freq = style["freq"] * torch.exp(style["freq_spread"] * nuisance[:, 0])  # (n,)
        angle = style["angle"] + style["angle_spread"] * nuisance[:, 1]
        phase = style["phase"] + style["phase_spread"] * nuisance[:, 2:4]  # (n, 2)
        centre = style["centre"] + variation.window_shift * nuisance[:, 4:6]  # (n, 2)
        return cls(freq=freq, angle=angle, phase=phase, freq2=freq * style["ratio"],
                   angle2=angle + style["turn"], centre=centre)


def _lattice(canvas: _Canvas, draw: _Draw, style: dict[str, Tensor]) -> Tensor:
    """(n, S, S) the ``lattice`` texture in ``(-1, 1)``: soft dots on a (sheared) lattice whose
    basis vectors follow the two components' orientations and periods."""
    n, size = draw.freq.shape[0], canvas.size
    period = 2 / draw.freq  # (n,) image units
    b1 = torch.stack([torch.cos(draw.angle), torch.sin(draw.angle)], -1) * period[:, None]
    b2 = torch.stack([torch.cos(draw.angle2), torch.sin(draw.angle2)], -1) * (
        period * style["ratio"])[:, None]
    basis = torch.stack([b1, b2], -1)  # (n, 2, 2): columns are the basis vectors
    points = torch.stack([canvas.x, canvas.y], -1).reshape(1, -1, 2)  # (1, S*S, 2)
    coords = torch.linalg.solve(basis[:, None], points[..., None])[..., 0]  # (n, S*S, 2)
    frac = coords + draw.phase[:, None] / (2 * math.pi)  # lattice offset from the phases
    frac = frac - frac.round()
    offset = (basis[:, None] @ frac[..., None])[..., 0]  # (n, S*S, 2) back to image units
    dist = offset.norm(dim=-1).reshape(n, size, size) / _grid(period)  # in periods
    edge = 2 / size / _grid(period) * (1 + 4 / style["gain"])  # soft for sine-like gains
    return 2 * torch.sigmoid((style["dot"] - dist) / edge) - 1


def _waves(canvas: _Canvas, draw: _Draw, style: dict[str, Tensor]) -> Tensor:
    """(n, S, S) the ``waves`` texture: a grating whose phase the second component bends
    along its lines."""
    across = (_grid(torch.cos(draw.angle)) * canvas.y
              - _grid(torch.sin(draw.angle)) * canvas.x)  # along the lines
    bend = 3 * style["spread"] * torch.sin(math.pi * _grid(draw.freq2) * across
                                           + _grid(draw.phase[:, 1]))
    return _wave(canvas.grating(draw.freq, draw.angle, draw.phase[:, 0]) + bend, style)


def _rings(canvas: _Canvas, draw: _Draw, style: dict[str, Tensor]) -> Tensor:
    """(n, S, S) the ``rings`` texture: rings, or 1 to 3 spiral arms, around each image's
    centre."""
    dx, dy = canvas.x - _grid(draw.centre[:, 0]), canvas.y - _grid(draw.centre[:, 1])
    r, theta = torch.sqrt(dx * dx + dy * dy), torch.atan2(dy, dx)
    s = (math.pi * _grid(draw.freq) * r + style["arms"] * (theta + _grid(draw.angle))
         + _grid(draw.phase[:, 0]))
    return _wave(s, style)


def _component(canvas: _Canvas, draw: _Draw, style: dict[str, Tensor], which: int) -> Tensor:
    """(n, S, S) the first (``which`` 0) or second (1) grating of the draw, in the class
    waveform."""
    if which == 0:
        return _wave(canvas.grating(draw.freq, draw.angle, draw.phase[:, 0]), style)
    return _wave(canvas.grating(draw.freq2, draw.angle2, draw.phase[:, 1]), style)


def _texture(
    family: str, canvas: _Canvas, draw: _Draw, style: dict[str, Tensor], white: Tensor
) -> Tensor:
    """(n, S, S) the class texture of ``family``, mostly in ``[-1, 1]``, before the window,
    contrast and clutter; ``white`` (n, S, S) is the field that ``noise`` filters."""
    if family == "grating":
        return _component(canvas, draw, style, 0)
    if family == "plaid":
        return 0.5 * (_component(canvas, draw, style, 0) + _component(canvas, draw, style, 1))
    if family == "checker":
        return _component(canvas, draw, style, 0) * _component(canvas, draw, style, 1)
    if family == "lattice":
        return _lattice(canvas, draw, style)
    if family == "noise":
        return torch.tanh(0.5 * style["gain"] * _band_noise(white, draw.freq, draw.angle, style))
    if family == "waves":
        return _waves(canvas, draw, style)
    return _rings(canvas, draw, style)


def _window(
    canvas: _Canvas, style: dict[str, Tensor], variation: Variation, nuisance: Tensor
) -> Tensor:
    """(n, S, S) in ``[0, 1]``: where the texture shows (1) and the flat level does (0).

    The class picks the whole frame, a disc around its centre, or one side of a line; each
    image moves it by the per-image normals ``nuisance[:, 6:9]``.
    """
    n, size = nuisance.shape[0], canvas.size
    kind = int(style["window"])
    if kind <= 1:
        return torch.ones(n, size, size)
    if kind == 2:  # a disc of the class radius around the class centre
        centre = style["centre"] + variation.window_shift * nuisance[:, 6:8]
        radius = style["radius"] * torch.exp(variation.window_scale * nuisance[:, 8])
        dist = torch.sqrt((canvas.x - _grid(centre[:, 0])) ** 2
                          + (canvas.y - _grid(centre[:, 1])) ** 2)
        return torch.sigmoid((_grid(radius) - dist) * size / 2)  # a one-pixel edge
    # one side of a line, its normal at the class's tilt
    edge = (style["radius"] - 0.65) + variation.window_shift * nuisance[:, 6]
    return torch.sigmoid(
        (canvas.along(style["tilt"] + 0.1 * nuisance[:, 7]) - _grid(edge)) * size / 2)


def _clutter(canvas: _Canvas, stray: Tensor, amount: float) -> Tensor:
    """(n, S, S) the stray grating laid over each image: a sine of 1.5 to 6 cycles at any
    angle and phase, of amplitude ``amount`` times ``stray[:, 3]``, from the uniforms
    ``stray`` (n, 4)."""
    phase = math.pi * _grid(1.5 * 4 ** stray[:, 0]) * canvas.along(math.pi * stray[:, 1]) + _grid(
        2 * math.pi * stray[:, 2])
    return amount * _grid(stray[:, 3]) * torch.sin(phase)


def _render(
    seed: int, index: int, *, image_size: int = 28, count: int = IMAGES_PER_CLASS,
    variation: Variation | None = None,
) -> tuple[Tensor, str]:
    """:func:`render_class`'s images and the class's family.

    Every random draw is made here, from the class's image key; the pieces it calls only
    compute, so each can be read (and changed) alone.
    """
    if not 0 <= index < NUM_CLASSES:
        raise DataError(f"patterns: class index must be in [0, {NUM_CLASSES}), got {index}")
    variation = variation or Variation()
    style_key, image_key = _class_keys(seed, index)
    style = _class_style(style_key)
    family = FAMILIES[int(style["family"])]
    n, size = count, image_size
    # per-image normals: 0-5 the draw (_Draw), 6-8 the window, 9 contrast, 10 brightness
    nuisance = random.normal(random.fold_in(image_key, 0), (n, 12))
    stray = random.uniform(random.fold_in(image_key, 2), (n, 4))  # the stray grating
    fields = random.normal(random.fold_in(image_key, 1), (n, 2, size, size))  # noise, white

    canvas = _Canvas.of_size(size)
    texture = _texture(family, canvas, _Draw.of(style, variation, nuisance), style, fields[:, 1])
    window = _window(canvas, style, variation, nuisance)
    contrast = _grid(style["contrast"] * torch.exp(variation.contrast * nuisance[:, 9]))
    bright = _grid(variation.brightness * nuisance[:, 10])
    texture = texture + _clutter(canvas, stray, variation.clutter)
    inside = style["level"] + contrast * texture
    images = window * inside + (1 - window) * style["outside"] + bright
    images = images + style["noise"] * fields[:, 0]
    return ((images.clamp(0, 1) * 255).round() / 255)[:, None], family  # (n, 1, S, S)


def generate_patterns(split: str, *, seed: int = 0, image_size: int = 28) -> ClassDataset:
    """Generate one split without touching the cache (see :func:`load_patterns`)."""
    classes = SPLITS[check_split("generate_patterns", split, SPLITS)]
    rendered = [_render(seed, c, image_size=image_size) for c in classes]
    pixels = (torch.stack([images for images, _ in rendered]) * 255).round().to(torch.uint8)
    names = [f"{c:04d}/{family}" for c, (_, family) in zip(classes, rendered, strict=True)]
    return ClassDataset(pixels, names, f"patterns/{split}")


def load_patterns(
    split: str, *, seed: int = 0, cache_dir: Path | None = None, image_size: int = 28
) -> ClassDataset:
    """The ``patterns`` split ``split`` (``"train"``, ``"val"`` or ``"test"``) as uint8, from
    the cache or generated (seconds) and cached, as
    :func:`~funcgraph.data.cache.generated_split` says."""
    return generated_split("patterns", GENERATOR_VERSION, split, seed=seed,
                           image_size=image_size, cache_dir=cache_dir,
                           generate=generate_patterns, loader="load_patterns", splits=SPLITS,
                           variation=str(asdict(Variation())))


__all__ = ["FAMILIES", "GENERATOR_VERSION", "IMAGES_PER_CLASS", "NUM_CLASSES", "SPLITS",
           "Variation", "generate_patterns", "load_patterns", "render_class"]
