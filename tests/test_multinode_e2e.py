"""Several machines, on one: a Ray cluster of two nodes (`ray.cluster_utils.Cluster`, each node its own
raylet), joined by a run with `ray.address`, `trainer.nnodes=2` and one rank per node. torch.distributed
(gloo) meets across the two nodes as it would across machines; here both listen on this machine's address.
The ranks report the Ray node they run on; Ray alone would have packed both onto one node (conftest)."""

import math
import os
import re
import subprocess

import pytest

from tests.test_train_e2e import changed_tensors, read_metrics, train, train_command


def test_one_rank_on_each_of_two_ray_nodes(tiny_model_path, tmp_path, two_node_ray_cluster):
    result = train("bandit", tiny_model_path, tmp_path, f"ray.address={two_node_ray_cluster.address}",
                   "trainer.nnodes=2", "trainer.n_cpu_ranks_per_node=1", "trainer.total_training_steps=2",
                   "trainer.val_before_train=false", "trainer.test_freq=-1", "es_manager.train.env_groups=2",
                   "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                   "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4")
    node_ids = re.search(r"Ray nodes of the actor ranks: (.+)", result.stdout).group(1).split()
    assert sorted(node_ids) == sorted(node.node_id for node in two_node_ray_cluster.list_all_nodes())  # one rank each
    metrics = read_metrics(tmp_path)
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert all(math.isfinite(m[key]) for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"))
        assert m["actor/grad_norm"] > 0
    assert changed_tensors(tiny_model_path, tmp_path / "global_step_2" / "actor")
    assert two_node_ray_cluster.remaining_processes_alive()  # a cluster joined with ray.address keeps running


def test_more_nodes_than_the_cluster_has_stop_with_the_fix(tiny_model_path, tmp_path, two_node_ray_cluster):
    command = train_command("bandit", tiny_model_path, tmp_path, f"ray.address={two_node_ray_cluster.address}",
                            "trainer.nnodes=4", "es_manager.train.env_groups=2",
                            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2")
    result = subprocess.run(command, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode != 0
    assert "trainer.nnodes=4 but the Ray cluster has 2 node(s)" in result.stderr and "ray.address" in result.stderr
