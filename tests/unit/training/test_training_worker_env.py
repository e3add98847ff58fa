import pytest

from distributed_testing.errors import ExecutionError
from distributed_testing.training.worker_main import RankEnv, bind_interface, select_device

TORCHRUN_ENV = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
}


def test_rank_env_from_torchrun_variables() -> None:
    assert RankEnv.from_environ(TORCHRUN_ENV) == RankEnv(3, 4, 1, 2, 1, "10.0.0.1", 29500)


def test_rank_env_outside_torchrun_is_an_execution_error() -> None:
    with pytest.raises(ExecutionError, match="run under torchrun"):
        RankEnv.from_environ({"RANK": "0"})
    with pytest.raises(ExecutionError, match="invalid"):
        RankEnv.from_environ({**TORCHRUN_ENV, "WORLD_SIZE": "many"})


def test_interface_overrides_inherited_socket_settings() -> None:
    environ = {"GLOO_SOCKET_IFNAME": "eth9", "NCCL_SOCKET_IFNAME": "eth9"}
    bind_interface("veth0", environ)
    assert environ == {"GLOO_SOCKET_IFNAME": "veth0", "NCCL_SOCKET_IFNAME": "veth0"}
    bind_interface(None, environ)
    assert environ["GLOO_SOCKET_IFNAME"] == "veth0"


def test_cpu_node_device_selection() -> None:
    assert str(select_device(0, "gloo")) == "cpu"
    with pytest.raises(ExecutionError, match="nccl but this node has no CUDA"):
        select_device(0, "nccl")
