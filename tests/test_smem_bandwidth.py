"""flashlib.smem_bandwidth: the shared-memory bytes a cycle of a Hopper warpgroup product, against counts by hand."""
import pytest

from flashlib.smem_bandwidth import SHARED_BYTES_PER_CYCLE, product_bytes_per_cycle, share_of_bandwidth


@pytest.mark.parametrize("n, a_in_registers, expected", [
    (64, False, 128.0), (128, False, 96.0), (256, False, 80.0), (80, False, 115.2),
    (64, True, 64.0), (128, True, 64.0), (256, True, 64.0)])
@pytest.mark.parametrize("operand_bytes", [2, 1])
def test_bytes_per_cycle_match_the_count_by_hand(n, a_in_registers, expected, operand_bytes):
    """16 bits: a 64 x 16 A and an N x 16 B (2048 + 32 N bytes) in N / 2 cycles; FP8 reads half the bytes at twice
    the rate, so the same bytes a cycle."""
    assert product_bytes_per_cycle(n, a_in_registers, operand_bytes) == pytest.approx(expected)


def test_both_operands_in_shared_memory_at_64_columns_take_all_of_it():
    assert share_of_bandwidth(product_bytes_per_cycle(64)) == 1.0
    assert share_of_bandwidth(product_bytes_per_cycle(64, a_in_registers=True)) == 0.5
    assert SHARED_BYTES_PER_CYCLE == 128


@pytest.mark.parametrize("kwargs, name", [(dict(n=0), "n must"), (dict(n=100), "n must"), (dict(n=512), "n must"),
                                          (dict(n=64.0), "n must"), (dict(n=True), "n must"),
                                          (dict(n=64, operand_bytes=4), "operand_bytes must")])
def test_bad_arguments_are_refused_by_name(kwargs, name):
    with pytest.raises(ValueError, match=name):
        product_bytes_per_cycle(**kwargs)
