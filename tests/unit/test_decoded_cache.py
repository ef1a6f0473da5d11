"""framework/data/decoded_cache.py on the real Fashion-MNIST label file (gzip IDX): the copy is used on the
second read, replaced when the source changes or the copy is damaged, and never needed."""
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from framework.data.decoded_cache import cached_decode
from framework.data.idx import read_idx

SOURCE = Path("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz")
pytestmark = pytest.mark.skipif(not SOURCE.exists(), reason="needs the Debian package dataset-fashion-mnist")


class CountingDecoder:
    def __init__(self):
        self.calls = 0

    def __call__(self, path):
        self.calls += 1
        return read_idx(path)


@pytest.fixture
def source(tmp_path):
    copy = tmp_path / "src" / SOURCE.name
    copy.parent.mkdir()
    shutil.copy(SOURCE, copy)
    return copy


def test_second_read_comes_from_the_copy_and_equals_the_decoded_file(tmp_path, source):
    decode, folder = CountingDecoder(), tmp_path / "decoded"
    first = cached_decode(source, decode, folder)
    second = cached_decode(source, decode, folder)
    assert decode.calls == 1 and len(list(folder.glob("*.npy"))) == 1 and not list(folder.glob("*.partial"))
    np.testing.assert_array_equal(first, read_idx(source))
    np.testing.assert_array_equal(second, first)
    assert second.flags.writeable and first.flags.writeable


def test_a_changed_source_is_decoded_again(tmp_path, source):
    decode, folder = CountingDecoder(), tmp_path / "decoded"
    cached_decode(source, decode, folder)
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    cached_decode(source, decode, folder)
    assert decode.calls == 2


def test_a_damaged_copy_is_decoded_again_and_replaced(tmp_path, source):
    decode, folder = CountingDecoder(), tmp_path / "decoded"
    cached_decode(source, decode, folder)
    [copy] = folder.glob("*.npy")
    copy.write_bytes(copy.read_bytes()[:100])  # truncated
    np.testing.assert_array_equal(cached_decode(source, decode, folder), read_idx(source))
    assert decode.calls == 2
    cached_decode(source, decode, folder)
    assert decode.calls == 2


def test_an_unwritable_folder_only_means_no_copy(tmp_path, source):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the folder would be")
    decode = CountingDecoder()
    np.testing.assert_array_equal(cached_decode(source, decode, blocker / "decoded"), read_idx(source))
    cached_decode(source, decode, blocker / "decoded")
    assert decode.calls == 2
