"""The picture of a DARTS search: a heat map of ``softmax(alpha)`` per cell kind.

matplotlib is imported when a map is drawn, never with the package.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from torch import Tensor

from ..nas import PRIMITIVES, edge_inputs
from ..nas.cell import STEPS


def write_heatmap(path: str | Path, weights: Mapping[str, Tensor],
                  primitives: Sequence[str] = PRIMITIVES, *,
                  label: str = "softmax(alpha)", steps: int = STEPS) -> None:
    """A PNG heat map of ``softmax(alpha)``: one panel per cell kind, edges x ops (the edges
    of cells of ``steps`` intermediate nodes); ``label`` names what ``weights`` hold, in the
    panel titles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{j}->{n}" for n, j in edge_inputs(steps)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 5.5), constrained_layout=True)
    for ax, kind in zip(axes, ("normal", "reduce"), strict=True):
        im = ax.imshow(weights[kind].cpu().numpy(), cmap="viridis", aspect="auto")
        ax.set_title(f"{kind} cell: {label}")
        ax.set_xticks(range(len(primitives)), primitives, rotation=45, ha="right")
        ax.set_yticks(range(len(labels)), labels)
        ax.set_ylabel("edge (input -> node)")
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.savefig(path, dpi=100)
    plt.close(fig)


__all__ = ["write_heatmap"]
