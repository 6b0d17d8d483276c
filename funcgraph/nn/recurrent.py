"""LSTM and GRU over padded batches with per-sequence lengths, as pure functions.

The recurrence is a Python loop over time steps; a sequence that has ended keeps its carry
(``h = where(t < length, h_new, h)``) and emits zeros. There are no packed sequences and no
cuDNN kernels, which is why these layers work under ``torch.func.vmap`` (over a batch of
param dicts or of inputs) and under second-order ``torch.func.grad`` (cuDNN RNNs have no
double backward). Param names and gate layouts are those of ``nn.LSTM``/``nn.GRU``, so a
module's ``state_dict()`` loads as is and outputs match it on ``pack_padded_sequence``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import random
from ..checks import check_sizes
from ..errors import ShapeError
from ..model import Model
from ..params import Params, State
from ..random import Key
from .init import uniform

Carry = tuple[Tensor, ...]
Cell = Callable[[Tensor, Tensor, Tensor | None, Carry], Carry]
"""``cell(x_gates_t, weight_hh, bias_hh, carry) -> new_carry``; ``carry[0]`` is ``h``."""


def _lstm_cell(gx: Tensor, w_hh: Tensor, b_hh: Tensor | None, carry: Carry) -> Carry:
    h, c = carry
    i, f, g, o = (gx + F.linear(h, w_hh, b_hh)).chunk(4, dim=-1)  # nn.LSTM's gate order
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def _gru_cell(gx: Tensor, w_hh: Tensor, b_hh: Tensor | None, carry: Carry) -> Carry:
    (h,) = carry
    r_x, z_x, n_x = gx.chunk(3, dim=-1)  # nn.GRU's gate order
    r_h, z_h, n_h = F.linear(h, w_hh, b_hh).chunk(3, dim=-1)
    r = torch.sigmoid(r_x + r_h)
    z = torch.sigmoid(z_x + z_h)
    n = torch.tanh(n_x + r * n_h)  # the reset gate scales W_hn h + b_hn, as in nn.GRU
    return ((1 - z) * n + z * h,)


def _check_input(fn: str, x: Any, input_size: int, batch_first: bool) -> tuple[Tensor, Any]:
    layout = "(B, T, F)" if batch_first else "(T, B, F)"
    if not isinstance(x, tuple | list) or len(x) != 2:
        raise ShapeError(
            f"{fn}: expected x = (inputs {layout}, lengths (B,) or None), got {type(x).__name__}"
        )
    inputs, lengths = x
    if not isinstance(inputs, Tensor) or inputs.dim() != 3 or inputs.shape[-1] != input_size:
        got = tuple(inputs.shape) if isinstance(inputs, Tensor) else type(inputs).__name__
        raise ShapeError(f"{fn}: expected inputs {layout} with F={input_size}, got {got}")
    return inputs, lengths


def _param_shapes(
    gates: int, input_size: int, hidden_size: int, num_layers: int, bias: bool
) -> dict[str, tuple[int, ...]]:
    """Every param's shape by its ``nn.LSTM``/``nn.GRU`` name, in their order (the order of
    the init keys): ``gates`` blocks of ``hidden_size`` rows per weight and bias."""
    out: dict[str, tuple[int, ...]] = {}
    for layer in range(num_layers):
        fan = input_size if layer == 0 else hidden_size
        out[f"weight_ih_l{layer}"] = (gates * hidden_size, fan)
        out[f"weight_hh_l{layer}"] = (gates * hidden_size, hidden_size)
        if bias:
            out[f"bias_ih_l{layer}"] = (gates * hidden_size,)
            out[f"bias_hh_l{layer}"] = (gates * hidden_size,)
    return out


def _valid_steps(
    kind: str, lengths: Any, inputs: Tensor, given_shape: tuple[int, ...]
) -> Tensor | None:
    """(B, T, 1) bool, True at the steps each sequence of ``inputs`` (B, T, F) holds, from its
    ``lengths`` (B,); ``None`` when every step counts. ``given_shape`` is the inputs' shape as
    the caller gave it, for the error."""
    if lengths is None:
        return None
    batch, steps = inputs.shape[0], inputs.shape[1]
    if not isinstance(lengths, Tensor) or lengths.shape != (batch,):
        got = tuple(lengths.shape) if isinstance(lengths, Tensor) else type(lengths)
        raise ShapeError(
            f"{kind}: lengths must have shape (B,) = ({batch},) for inputs "
            f"{given_shape}, got {got}"
        )
    if lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
        raise ShapeError(f"{kind}: lengths must be an integer tensor, got {lengths.dtype}")
    steps_idx = torch.arange(steps, device=inputs.device)
    return (steps_idx < lengths.unsqueeze(-1)).unsqueeze(-1)  # (B, T, 1)


def _run_layer(
    cell: Cell, gx: Tensor, w_hh: Tensor, b_hh: Tensor | None, carry_size: int,
    hidden_size: int, valid: Tensor | None,
) -> tuple[Tensor, Carry]:
    """One layer over every step: its outputs (B, T, H) and its final carry.

    ``gx`` (B, T, gates * H) is the input projection of every step; a step outside a
    sequence (``valid`` False) keeps the carry and outputs zeros.
    """
    zeros = gx.new_zeros(gx.shape[0], hidden_size)
    carry: Carry = (zeros,) * carry_size
    outs = []
    for t in range(gx.shape[1]):
        stepped = cell(gx[:, t], w_hh, b_hh, carry)
        if valid is None:
            carry = stepped
            outs.append(stepped[0])
        else:
            valid_now = valid[:, t]  # (B, 1)
            carry = tuple(torch.where(valid_now, after, before)
                          for after, before in zip(stepped, carry, strict=True))
            outs.append(torch.where(valid_now, stepped[0], zeros))
    return torch.stack(outs, dim=1), carry  # (B, T, H)


def _recurrent(
    kind: str,
    cell: Cell,
    gates: int,
    input_size: int,
    hidden_size: int,
    num_layers: int,
    bias: bool,
    batch_first: bool,
    dtype: torch.dtype | None,
) -> Model:
    """The Model both :func:`lstm` and :func:`gru` are: ``gates`` blocks of ``hidden_size``
    rows per weight, ``cell`` for one step, a carry of ``(h, c)`` (LSTM) or ``(h,)`` (GRU)."""
    check_sizes(kind, input_size=input_size, hidden_size=hidden_size, num_layers=num_layers)
    carry_size = 2 if kind == "lstm" else 1
    bound = 1.0 / math.sqrt(hidden_size)
    param_shapes = _param_shapes(gates, input_size, hidden_size, num_layers, bias)

    def init(key: Key) -> tuple[Params, State]:
        """``U(-1/sqrt(H), 1/sqrt(H))`` for every param, one key each."""
        keys = random.split(key, len(param_shapes))
        params = {name: uniform(k, shape, -bound, bound, dtype)
                  for (name, shape), k in zip(param_shapes.items(), keys, strict=True)}
        return params, {}

    def apply(
        params: Params, state: State, x: Any, *, key: Key | None = None, train: bool = False
    ) -> tuple[Any, State]:
        """The layers in turn, each over every step; the outputs and final carries stacked."""
        inputs, lengths = _check_input(kind, x, input_size, batch_first)
        if not batch_first:
            inputs = inputs.transpose(0, 1)  # inputs: (B, T, F)
        valid = _valid_steps(kind, lengths, inputs, tuple(x[0].shape))
        layer_in = inputs
        finals: list[Carry] = []
        for layer in range(num_layers):
            # The input projection of every step at once: (B, T, gates * H).
            gx = F.linear(layer_in, params[f"weight_ih_l{layer}"], params.get(f"bias_ih_l{layer}"))
            layer_in, final = _run_layer(cell, gx, params[f"weight_hh_l{layer}"],
                                         params.get(f"bias_hh_l{layer}"), carry_size,
                                         hidden_size, valid)
            finals.append(final)
        outputs = layer_in if batch_first else layer_in.transpose(0, 1)
        h_n = torch.stack([final[0] for final in finals])  # (num_layers, B, H)
        if kind == "gru":
            return (outputs, h_n), state
        c_n = torch.stack([final[1] for final in finals])
        return (outputs, (h_n, c_n)), state

    meta = {"input_size": input_size, "hidden_size": hidden_size, "num_layers": num_layers,
            "bias": bias, "batch_first": batch_first}
    return Model(init, apply, kind, meta)


def lstm(
    input_size: int,
    hidden_size: int,
    *,
    num_layers: int = 1,
    bias: bool = True,
    batch_first: bool = True,
    dtype: torch.dtype | None = None,
) -> Model:
    """A stacked LSTM over padded sequences, with params named and laid out as ``nn.LSTM``.

    Arguments:
        input_size: as ``nn.LSTM``.
        hidden_size: as ``nn.LSTM``.
        num_layers: as ``nn.LSTM``.
        bias: as ``nn.LSTM``.
        batch_first: as ``nn.LSTM``.
        dtype: dtype of the params (default ``torch.get_default_dtype()``), initialised
            ``U(-1/sqrt(H), 1/sqrt(H))`` from the key.
    Apply:
        ``x = (inputs, lengths)``: ``inputs (B, T, F)`` (``(T, B, F)`` when
        ``batch_first=False``) padded, ``lengths (B,)`` integer valid steps per sequence,
        or ``None`` for all ``T``.
        ``y = (outputs, (h_n, c_n))`` as ``nn.LSTM``: ``outputs (B, T, H)`` zero at padded
        steps, ``h_n``/``c_n (num_layers, B, H)`` taken at each sequence's last valid step
        (zeros for a length of 0; lengths above ``T`` count as ``T``). Lengths are not
        range-checked: that would need their values, which ``vmap`` does not allow.

    Example::

        model = funcgraph.nn.lstm(8, 16)
        params, state = model.init(funcgraph.random.key(0))
        (out, (h_n, c_n)), _ = model.apply(params, state, (x, lengths))
    """
    return _recurrent("lstm", _lstm_cell, 4, input_size, hidden_size, num_layers, bias,
                      batch_first, dtype)


def gru(
    input_size: int,
    hidden_size: int,
    *,
    num_layers: int = 1,
    bias: bool = True,
    batch_first: bool = True,
    dtype: torch.dtype | None = None,
) -> Model:
    """A stacked GRU over padded sequences, with params named and laid out as ``nn.GRU``.

    Same arguments and ``x`` as :func:`lstm`; ``y = (outputs (B, T, H), h_n (num_layers, B, H))``
    as ``nn.GRU``, with zeros at padded steps and ``h_n`` at each sequence's last valid step.
    """
    return _recurrent("gru", _gru_cell, 3, input_size, hidden_size, num_layers, bias,
                      batch_first, dtype)


__all__ = ["gru", "lstm"]
