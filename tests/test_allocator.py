import platform

import pytest

from service.allocator import fix_mmap_threshold, numpy_hugepages


def test_zero_leaves_the_allocator_alone():
    assert fix_mmap_threshold(0) is False


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_takes_a_fixed_threshold():
    # 128 KiB is glibc's own starting threshold, so fixing it changes little else in the tests.
    assert fix_mmap_threshold(128) is True


def test_numpy_hugepages_switches_and_reports_the_previous_setting():
    before = numpy_hugepages(False)
    try:
        assert numpy_hugepages(True) is False
        assert numpy_hugepages(False) is True
    finally:
        numpy_hugepages(before)
