"""Counter-based keys: known answers, determinism, independence, distributions, vmap."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from funcgraph import nn, random
from funcgraph.errors import FuncgraphError, KeyMissingError, KeyTypeError

# Known-answer vectors of Threefry-2x32-20 from the Random123 distribution (kat_vectors).
KAT = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]


@pytest.mark.parametrize(("key", "counter", "expected"), KAT)
def test_threefry_known_answers(key, counter, expected):
    y0, y1 = random.threefry2x32(
        torch.tensor(key), torch.tensor([counter[0]]), torch.tensor([counter[1]])
    )
    assert (int(y0), int(y1)) == expected


def test_split_matches_jax_threefry_layout():
    # jax.random.split(jax.random.PRNGKey(0)) as printed in JAX's documentation.
    got = random.split(random.key(0)).tolist()
    assert got == [[4146024105, 967050713], [2718843009, 1272950319]]


def test_key_words_hold_the_seed():
    assert random.key(2**40 + 7).tolist() == [2**8, 7]


def test_same_key_same_numbers_and_different_keys_differ():
    k = random.key(42)
    assert torch.equal(random.uniform(k, (100,)), random.uniform(k, (100,))), (
        "the same key gave different numbers")
    a, b = random.split(k)
    assert not torch.equal(random.uniform(a, (100,)), random.uniform(b, (100,))), (
        "split keys gave the same numbers")


def test_no_collisions_among_split_keys():
    keys = random.split(random.key(3), 100_000)
    assert torch.unique(keys, dim=0).shape[0] == 100_000, "split produced duplicate keys"
    folded = torch.stack([random.fold_in(random.key(3), i) for i in range(2000)])
    assert torch.unique(folded, dim=0).shape[0] == 2000, "fold_in produced duplicate keys"


def _ks_statistic(samples: torch.Tensor, cdf) -> float:
    x, _ = torch.sort(samples.double())
    n = x.numel()
    f = cdf(x)
    upper = torch.arange(1, n + 1, dtype=torch.float64) / n - f
    lower = f - torch.arange(0, n, dtype=torch.float64) / n
    return float(torch.maximum(upper, lower).max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_uniform_range_moments_and_ks(dtype):
    n = 50_000
    u = random.uniform(random.key(1), (n,), dtype=dtype)
    assert u.dtype == dtype
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 4 * math.sqrt(1 / 12 / n)
    assert abs(float(u.var()) - 1 / 12) < 0.002
    # Kolmogorov-Smirnov at the 1% level: critical value 1.63 / sqrt(n).
    assert _ks_statistic(u, lambda x: x) < 1.63 / math.sqrt(n)


def test_normal_moments_and_ks():
    n = 50_000
    z = random.normal(random.key(2), (n,))
    assert abs(float(z.mean())) < 4 / math.sqrt(n)
    assert abs(float(z.var()) - 1.0) < 0.03
    assert torch.isfinite(z).all()
    cdf = lambda x: 0.5 * (1 + torch.erf(x / math.sqrt(2)))  # noqa: E731
    assert _ks_statistic(z, cdf) < 1.63 / math.sqrt(n)


def test_uniform_bounds_and_bernoulli_frequency():
    u = random.uniform(random.key(5), (1000,), low=-2.0, high=3.0)
    assert float(u.min()) >= -2.0 and float(u.max()) < 3.0
    b = random.bernoulli(random.key(6), 0.3, (20_000,))
    assert b.dtype == torch.bool
    assert abs(float(b.float().mean()) - 0.3) < 0.015


def test_randint_permutation_choice():
    r = random.randint(random.key(7), (10_000,), 3, 8)
    assert r.dtype == torch.int64
    assert set(r.tolist()) == {3, 4, 5, 6, 7}
    counts = torch.bincount(r - 3).double()
    assert float((counts / counts.sum() - 0.2).abs().max()) < 0.02
    p = random.permutation(random.key(8), 50)
    assert sorted(p.tolist()) == list(range(50))
    c = random.choice(random.key(9), 20, 7)
    assert len(set(c.tolist())) == 7 and max(c.tolist()) < 20


def test_vmap_over_keys_equals_loop_over_keys():
    keys = random.split(random.key(11), 5)

    def draw(k):
        return random.normal(k, (3, 4)) + random.uniform(random.fold_in(k, 1), (3, 4))

    batched = torch.func.vmap(draw)(keys)
    looped = torch.stack([draw(k) for k in keys])
    assert torch.equal(batched, looped), "vmap over keys != a loop over them"
    assert not torch.equal(batched[0], batched[1]), "vmapped keys gave identical streams"


def test_vmap_split_and_bernoulli():
    keys = random.split(random.key(12), 4)
    batched = torch.func.vmap(lambda k: random.bernoulli(random.split(k)[1], 0.5, (8,)))(keys)
    looped = torch.stack([random.bernoulli(random.split(k)[1], 0.5, (8,)) for k in keys])
    assert torch.equal(batched, looped), "vmapped bernoulli != a loop over the keys"


def test_missing_key_is_a_clear_error():
    with pytest.raises(KeyMissingError, match=r"^random\.uniform: this call needs randomness"):
        random.uniform(None, (2,))
    with pytest.raises(ValueError, match=r"^random\.key: seed must be an int"):
        random.key(-1)


WRONG_KEYS = {
    "int": (3, "int 3"),
    "float tensor": (torch.zeros(2), "torch.float32 tensor of shape (2,)"),
    "wrong shape": (torch.zeros(3, dtype=torch.int64), "torch.int64 tensor of shape (3,)"),
    "list": ([0, 1], "list [0, 1]"),
}


@pytest.mark.parametrize("what", sorted(WRONG_KEYS))
@pytest.mark.parametrize("fn", ["split", "fold_in", "uniform", "normal", "permutation"])
def test_wrong_key_is_a_key_type_error_naming_the_function(what, fn):
    wrong, described = WRONG_KEYS[what]
    call = {"split": lambda k: random.split(k, 2), "fold_in": lambda k: random.fold_in(k, 1),
            "uniform": lambda k: random.uniform(k, (2,)),
            "normal": lambda k: random.normal(k, (2,)),
            "permutation": lambda k: random.permutation(k, 3)}[fn]
    with pytest.raises(KeyTypeError) as info:
        call(wrong)
    message = str(info.value)
    assert message.startswith(f"random.{fn}: key must be a funcgraph key, an int64 tensor"), (
        message)
    assert f"got {described}" in message, message
    assert "funcgraph.random.key(0)" in message, "the message must say how to make a key"
    assert isinstance(info.value, FuncgraphError) and isinstance(info.value, TypeError)


def test_model_init_names_itself_for_a_wrong_key():
    with pytest.raises(KeyTypeError, match=r"^Model\.init of 'linear': key must be .* got int 0"):
        nn.linear(2, 3).init(0)
    with pytest.raises(KeyTypeError, match=r"of shape \(2,\); got torch\.int64 tensor of shape "
                                           r"\(4, 2\)"):
        nn.linear(2, 3).init(random.split(random.key(0), 4))
    with pytest.raises(KeyMissingError, match=r"^Model\.init of 'serial': this call needs"):
        nn.serial(nn.linear(2, 3)).init(None)


def test_global_generator_untouched():
    before = torch.random.get_rng_state()
    random.normal(random.key(0), (100,))
    random.permutation(random.key(0), 10)
    assert torch.equal(before, torch.random.get_rng_state()), "torch's global RNG state moved"


@given(st.integers(min_value=0, max_value=2**64 - 1), st.integers(1, 40))
def test_uniform_in_unit_interval_for_any_seed(seed, n):
    u = random.uniform(random.key(seed), (n,))
    assert u.shape == (n,)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0


def test_shapes_only_draws_shapes_and_dtypes_without_values_and_only_inside() -> None:
    k = random.key(3)
    before = random.uniform(k, (2, 3))
    with random.shapes_only():
        u = random.uniform(k, (2, 3), dtype=torch.float64)
        n = random.normal(k, (4,))
        b = random.bits(k, (5,))
        keys = random.split(k, 3)
        folded = random.fold_in(k, 7)
    assert (u.device.type, u.shape, u.dtype) == ("meta", (2, 3), torch.float64)
    assert (n.device.type, n.shape, n.dtype) == ("meta", (4,), torch.get_default_dtype())
    assert (b.device.type, b.shape, b.dtype) == ("meta", (5,), torch.int64)
    assert keys.shape == (3, 2) and folded.shape == (2,) and keys.device.type == "cpu"
    assert torch.equal(random.uniform(k, (2, 3)), before), "the switch outlived its block"


def test_a_model_shaped_under_shapes_only_matches_its_real_init() -> None:
    from funcgraph.models import conv4

    model = conv4(5, image_size=16)
    real, _ = model.init(random.key(0))
    with random.shapes_only():
        shaped, _ = model.init(random.key(0))
    assert {n: (t.shape, t.dtype) for n, t in shaped.items()} == {
        n: (t.shape, t.dtype) for n, t in real.items()}
