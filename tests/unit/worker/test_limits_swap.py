"""``--enable-swap`` in the pure limit decisions: with ``count_swap`` the memory limit, the memory
buffer and the memory offered to tasks see RAM + swap; without it swap counts for nothing. Swap
use is reported either way."""

from __future__ import annotations

from distributed_testing.worker.limits import Limits, Sample, breaches, memory_for_tasks_mb, swap_percent

GIB = 1024.0


def sample(*, ram_total: float = 16 * GIB, ram_available: float = 2 * GIB, swap_total: float = 16 * GIB,
           swap_free: float = 12 * GIB) -> Sample:
    used = 100.0 * (ram_total - ram_available) / ram_total
    return Sample(cpu_percent=5.0, memory_percent=used, available_mb=ram_available, total_mb=ram_total,
                  swap_total_mb=swap_total, swap_free_mb=swap_free)


def test_without_the_flag_swap_counts_for_nothing() -> None:
    limits = Limits(max_memory_percent=80, memory_buffer=0.2)
    s = sample()  # RAM 87.5 % used, 12.5 % free
    assert breaches(limits, s) == ["memory 88% > limit 80%", "free memory 12% < buffer 20%"]
    assert memory_for_tasks_mb(limits, s) == 0.0  # 2 GiB available, 3.2 GiB buffer


def test_with_the_flag_free_swap_is_overflow_memory_for_the_limits_and_the_offer() -> None:
    limits = Limits(max_memory_percent=80, memory_buffer=0.2, count_swap=True)
    s = sample()  # RAM + swap: 32 GiB, 14 GiB available (56 % used, 44 % free)
    assert breaches(limits, s) == []
    assert memory_for_tasks_mb(limits, s) == round(14 * GIB - 0.2 * 32 * GIB, 1)  # 7.6 GiB offered


def test_with_the_flag_used_swap_counts_as_used_memory() -> None:
    limits = Limits(max_memory_percent=80, memory_buffer=0.2, count_swap=True)
    s = sample(ram_available=1 * GIB, swap_free=1 * GIB)  # 30 of 32 GiB used
    assert breaches(limits, s) == ["memory+swap 94% > limit 80%", "free memory+swap 6% < buffer 20%"]
    assert memory_for_tasks_mb(limits, s) == 0.0


def test_a_machine_without_swap_is_judged_on_ram_alone_either_way() -> None:
    s = sample(swap_total=0, swap_free=0)
    for count_swap in (False, True):
        limits = Limits(memory_buffer=0.1, count_swap=count_swap)
        assert memory_for_tasks_mb(limits, s) == round(2 * GIB - 0.1 * 16 * GIB, 1)
    assert swap_percent(s) is None


def test_swap_use_is_reported_as_a_percentage() -> None:
    assert swap_percent(sample()) == 25.0
    assert swap_percent(sample(swap_free=16 * GIB)) == 0.0
