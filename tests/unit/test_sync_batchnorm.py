"""strategy.sync_batchnorm's BatchNorm in this process (framework/strategies/mesh/sync_batchnorm.py): a world of one (or no
process group) is plain BatchNorm. On the ranks of a gloo world: tests/dist/test_sync_batchnorm.py."""
import pytest
import torch
from torch import nn

CPU = torch.device("cpu")


@pytest.mark.parametrize("momentum", [0.1, None])
def test_one_worker_is_plain_batchnorm(momentum):
    """A world of one (or no process group): BatchNorm's own statistics, momentum or cumulative average."""
    from framework.strategies.mesh.sync_batchnorm import convert_sync_batchnorm

    torch.manual_seed(0)
    plain = nn.BatchNorm2d(3, momentum=momentum)
    synced = convert_sync_batchnorm(nn.Sequential(nn.BatchNorm2d(3, momentum=momentum)), CPU)[0]
    x = torch.randn(4, 3, 5, 5)
    for _ in range(2):
        torch.testing.assert_close(synced(x), plain(x))
    torch.testing.assert_close(synced.running_var, plain.running_var)
    assert synced.num_batches_tracked.item() == plain.num_batches_tracked.item() == 2
