"""The world-size-invariant mode's reducers in this process, on one rank (framework/training/invariant/): the fixed
tree order, what the fixed-point sum promises (each shard rounded at one scale, summed exactly, rounded once), a
non-finite shard, float64 gradients, what the sum holds in memory and reads back from the device, and the shard
bookkeeping. 1, 2 and 4 real gloo ranks giving the same bits:
tests/dist/test_invariant_reducers.py."""
import math

import pytest
import torch
from torch.overrides import TorchFunctionMode

from framework.common.errors import ConfigError
from framework.training.engine import LocalGroup
from framework.training.invariant import FixedPointSum, GatheredTreeSum, owned_shards, tree_sum
from support.live_bytes import LiveBytes

ONE = LocalGroup(torch.device("cpu"))


def _shards(k: int, seed: int = 0) -> list[list[torch.Tensor]]:
    """k shards' gradients of two parameters, magnitudes spread over 2^-20 .. 2^20."""
    g = torch.Generator().manual_seed(seed)
    spread = lambda *shape: torch.randn(*shape, generator=g) * 2.0 ** torch.randint(-20, 21, shape, generator=g)
    return [[spread(6, 5), spread(9)] for _ in range(k)]


def test_tree_sum_adds_neighbours_level_by_level_and_that_order_is_not_left_to_right():
    t = [torch.tensor([x], dtype=torch.float32) for x in (1e8, 1.0, -1e8, 1.0, 3.0)]
    assert torch.equal(tree_sum(t), ((t[0] + t[1]) + (t[2] + t[3])) + t[4])
    left_to_right = t[0] + t[1] + t[2] + t[3] + t[4]
    assert not torch.equal(tree_sum(t), left_to_right)  # 3.0 against 4.0: the order is the result


def test_one_tensor_sums_to_a_copy_of_itself():
    t = torch.randn(3)
    out = tree_sum([t])
    assert torch.equal(out, t) and out.data_ptr() != t.data_ptr()


@pytest.mark.parametrize("k", [1, 2, 8])
def test_the_gathered_sum_on_one_rank_is_the_tree_sum_of_every_shard(k):
    shards = _shards(k)
    summed = GatheredTreeSum(k).reduce(shards, ONE)
    for j in range(2):
        assert torch.equal(summed[j], tree_sum([s[j] for s in shards]))


def test_the_fixed_point_sum_is_exact_where_every_shard_fits_its_scale():
    """Shard values on a grid the scale holds: the integer sum is the exact sum, rounded once to float32."""
    g = torch.Generator().manual_seed(1)
    shards = [[torch.randint(-2**20, 2**20, (7, 3), generator=g).float() * 2.0 ** -12] for _ in range(8)]
    exact = sum(s[0].double() for s in shards)
    assert torch.equal(FixedPointSum(8).reduce(shards, ONE)[0], exact.float())


def test_the_fixed_point_sum_stays_within_its_bound_of_the_exact_sum_and_is_not_the_float_sum():
    shards = _shards(8)
    fixed, gathered = FixedPointSum(8).reduce(shards, ONE), GatheredTreeSum(8).reduce(shards, ONE)
    for j in range(2):
        exact = sum(s[j].double() for s in shards)  # 8 float32s in float64: exact up to a few bits of 2^-52
        largest = max(s[j].abs().max().item() for s in shards)
        scale = FixedPointSum(8).bits - math.frexp(largest)[1]
        ulp = torch.finfo(torch.float32).eps * exact.abs()  # a unit of the result's last place, at most
        assert ((fixed[j].double() - exact).abs() <= 8 * 2.0 ** -(scale + 1) + ulp).all()
    assert not all(torch.equal(a, b) for a, b in zip(fixed, gathered))


@pytest.mark.parametrize("magnitude", [4.0e37, 2.0 ** -149, 0.0])  # 8 of the first near float32's largest; the least
def test_extreme_magnitudes_neither_overflow_nor_vanish(magnitude):
    shards = [[torch.full((4,), magnitude)] for _ in range(8)]
    expected = sum(s[0].double() for s in shards).float()
    assert torch.equal(FixedPointSum(8).reduce(shards, ONE)[0], expected)


@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_a_non_finite_shard_makes_its_tensor_nan_and_leaves_the_others(bad):
    clean = FixedPointSum(4).reduce(_shards(4), ONE)
    shards = _shards(4)
    shards[2][0][1, 1] = bad
    summed = FixedPointSum(4).reduce(shards, ONE)
    assert summed[0].isnan().all() and clean[0].isfinite().all()
    assert torch.equal(summed[1], clean[1])


def test_a_rank_owns_the_shards_congruent_to_its_rank():
    assert list(owned_shards(1, 4, 8)) == [1, 5]
    assert list(owned_shards(0, 1, 4)) == [0, 1, 2, 3]


def test_shards_that_do_not_divide_over_the_ranks_are_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"^trainer.micro_shards=6 is not allowed with 4 data-parallel ranks: it "
                                          r"must be a multiple of the number of ranks$"):
        owned_shards(0, 4, 6)


def test_a_rank_handing_the_wrong_number_of_shards_or_shapes_is_an_error():
    with pytest.raises(ValueError, match="do not make 8 shards"):
        GatheredTreeSum(8).reduce(_shards(4), ONE)
    shards = _shards(2)
    shards[1][0] = torch.zeros(5, 6)
    with pytest.raises(ValueError, match="same tensors"):
        FixedPointSum(2).reduce(shards, ONE)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_other_gradient_dtypes_come_back_in_their_dtype_as_the_exact_sum_rounded_once(dtype):
    g = torch.Generator().manual_seed(2)
    shards = [[(torch.randn(50, generator=g) * 2.0 ** -3).to(dtype)] for _ in range(8)]
    summed = FixedPointSum(8).reduce(shards, ONE)[0]
    assert summed.dtype == dtype
    assert torch.equal(summed, sum(s[0].double() for s in shards).to(dtype))


# far past float32's range both ways, on the grid the scale holds (so the sum is exact); float64's least
@pytest.mark.parametrize("magnitude", [3 * 2.0 ** 700, 3 * 2.0 ** -700, 2.0 ** -1074])
def test_float64_gradients_far_outside_float32s_range_are_summed_not_lost(magnitude):
    """The scale 2^s is made in float64: made in float32 it overflowed (small gradients: every one summed to 0) or
    vanished (large ones: NaN, a skipped or stopped step) for float64 gradients."""
    shards = [[torch.full((4,), magnitude, dtype=torch.float64)] for _ in range(8)]
    assert torch.equal(FixedPointSum(8).reduce(shards, ONE)[0], torch.full((4,), 8 * magnitude, dtype=torch.float64))


def test_the_fixed_point_sums_memory_does_not_grow_with_the_shards_a_rank_owns():
    """The stash (K/W gradients) is the only copy of a rank's shards: the sum takes one shard's flat row at a time.
    A flat copy of every owned shard at once doubled it (on a GPU, the first thing to run out of memory with one
    rank owning all 8 shards): 6 rows more at 8 shards than at 2."""
    row = 4 * 100_000

    def peak(k: int) -> int:
        shards = [[torch.randn(99_000), torch.randn(1_000)] for _ in range(k)]
        with LiveBytes() as memory:
            FixedPointSum(k).reduce(shards, ONE)
        return memory.peak

    assert peak(8) - peak(2) < row


def test_the_fixed_point_sum_gives_torch_every_output_length_it_would_read_back_from_the_device():
    """repeat_interleave with tensor repeats and no output_size reads the repeats' sum back to the host: on a GPU a
    synchronization of the device on every call (three a step); the sum passes the length it knows."""
    seen = []

    class Calls(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append((func, kwargs or {}))
            return func(*args, **(kwargs or {}))

    with Calls():
        FixedPointSum(4).reduce(_shards(4), ONE)
    repeats = [kwargs for func, kwargs in seen if func is torch.repeat_interleave]
    assert len(repeats) == 3 and all(kwargs.get("output_size") == 6 * 5 + 9 for kwargs in repeats)
    assert torch.Tensor.item not in [func for func, _ in seen]
