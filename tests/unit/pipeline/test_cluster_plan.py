"""The cluster description (`cluster:` of a pipeline file) and one host's plan (`stacx node up`):
the one-host default is the single-host pipeline; a host runs exactly its roles; three broker
hosts give replicated topics; bad files are one line naming the field."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from stacx.infra.pipeline import PipelineConfigError, parse_spec
from stacx.infra.pipeline.layout import RunLayout
from stacx.infra.pipeline.node import brokers_needed, plan_node, service_specs
from stacx.infra.services.kafka import cluster_id_for, cluster_properties
from stacx.rollout.config import SandboxConfig

REPO = Path(__file__).resolve().parents[3]
CLUSTER_FILE = REPO / "examples" / "cluster" / "cluster.yaml"


def _tree(path: Path = CLUSTER_FILE) -> dict[str, Any]:
    tree = yaml.safe_load(path.read_text())
    tree["pipeline"]["plugin_paths"] = [str(REPO / "examples")]
    return tree


def _spec(tree: dict[str, Any]) -> Any:
    return parse_spec(copy.deepcopy(tree), source="cluster.yaml", base_dir=REPO / "examples" / "cluster")


def _roles(spec: Any, host: str) -> set[str]:
    layout = RunLayout.create(spec)
    node = plan_node(spec, layout, host)
    names = {s.name for s in service_specs(node, spec.cluster, Path("/cfg"))}
    return names | ({"broker"} if node.broker is not None else set())


def test_without_a_cluster_section_one_host_runs_every_service_but_the_broker() -> None:
    spec = _spec(_tree(REPO / "examples" / "quickstart.yaml"))
    assert [h.name for h in spec.cluster.hosts] == ["local"]
    assert _roles(spec, "local") == {"gateway", "inference", "rollout", "assembler", "trainer"}
    assert spec.topics.replication_factor == 1 and spec.topics.min_insync_replicas is None
    assert RunLayout.create(spec, now=0).run_id == "quickstart-19700101-000000"  # as `stacx run`


def test_each_host_of_the_example_runs_exactly_its_roles() -> None:
    spec = _spec(_tree())
    for host in spec.cluster.hosts:
        assert _roles(spec, host.name) == set(host.roles), host.name
    assert RunLayout.create(spec).run_id == "cluster-demo"  # fixed: every host joins one run


def test_three_broker_hosts_replicate_topics_three_times_with_two_in_sync() -> None:
    spec = _spec(_tree())
    assert (spec.topics.replication_factor, spec.topics.min_insync_replicas) == (3, 2)
    assert spec.bootstrap_servers == "10.0.0.1:9092,10.0.0.2:9092,10.0.0.3:9092"
    specs = RunLayout.create(spec).topics.specs(spec.topics)
    assert {(s.replication_factor, s.config["min.insync.replicas"]) for s in specs} == {(3, "2")}


def test_a_node_waits_for_a_broker_quorum_not_for_every_broker() -> None:
    """Three broker hosts with min.insync.replicas 2 accept writes with one host down: a node
    (re)started then starts its services once two answer."""
    spec = _spec(_tree())
    assert brokers_needed(spec) == 2
    tree = _tree()
    tree["topics"] = {"replication_factor": 3, "min_insync_replicas": 3}
    assert brokers_needed(_spec(tree)) == 3
    tree["topics"] = {"replication_factor": 1}  # no min.insync: a KRaft majority still
    assert brokers_needed(_spec(tree)) == 2
    assert brokers_needed(_spec(_tree(REPO / "examples" / "quickstart.yaml"))) == 1


def _env(spec: Any, host: str) -> dict[str, dict[str, str]]:
    node = plan_node(spec, RunLayout.create(spec), host)
    return {s.name: s.env for s in service_specs(node, spec.cluster, Path("/cfg"))}


def test_node_up_places_gpus_per_service_as_stacx_run_does() -> None:
    """`resources:` in a cluster file: each host's trainer ranks and inference server see only
    their own GPUs (indices are the host's own), also on a host with both roles."""
    tree = _tree()
    tree["cluster"]["hosts"][3]["roles"].append("trainer")  # roll-1: server and ranks on one host
    tree["cluster"]["hosts"][3]["trainer_ranks"] = 2
    tree["resources"] = {"trainer": [0, 1], "inference": [2]}
    tree["trainer"]["backend"].pop("device")  # the GPUs decide
    spec = _spec(tree)
    both = _env(spec, "roll-1")
    assert both["inference"]["CUDA_VISIBLE_DEVICES"] == "2"
    assert both["trainer"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert _env(spec, "roll-2")["inference"]["CUDA_VISIBLE_DEVICES"] == "2"
    assert _env(spec, "train-2")["trainer"] == {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0",
                                                "CUDA_VISIBLE_DEVICES": "0,1"}
    assert "CUDA_VISIBLE_DEVICES" not in _env(spec, "roll-1")["rollout"]
    assert all("CUDA_VISIBLE_DEVICES" not in env for env in _env(_spec(_tree()), "roll-1").values())


def test_a_replication_the_user_sets_wins_over_the_cluster_default() -> None:
    tree = _tree()
    tree["topics"] = {"replication_factor": 2}
    spec = _spec(tree)
    assert (spec.topics.replication_factor, spec.topics.min_insync_replicas) == (2, None)


def test_more_replicas_than_broker_hosts_is_one_line() -> None:
    tree = _tree()
    tree["cluster"]["hosts"] = [h for h in tree["cluster"]["hosts"] if h["name"] != "kafka-3"]
    tree["topics"] = {"replication_factor": 3}
    with pytest.raises(PipelineConfigError) as caught:
        _spec(tree)
    assert str(caught.value) == (
        "cluster.yaml: topics.replication_factor=3 needs as many broker hosts; "
        "cluster.hosts has 2 with role broker"
    )


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda hosts: hosts.append(dict(hosts[0])), "host names must be unique: kafka-1"),
        (lambda hosts: hosts[5].update(roles=["trainer"]), "no host has the role(s) assembler"),
        (lambda hosts: hosts[3].update(roles=["rollout", "assembler"]), "the assembler runs on one host"),
        (lambda hosts: hosts[3].update(roles=["rolout"]), "cluster.hosts.3.roles.0: expected 'broker'"),
        (lambda hosts: hosts[1].update(address="10.0.0.1"), "broker hosts need distinct addresses"),
    ],
)
def test_a_broken_cluster_section_is_one_line_naming_it(change: Any, expected: str) -> None:
    tree = _tree()
    change(tree["cluster"]["hosts"])
    with pytest.raises(PipelineConfigError) as caught:
        _spec(tree)
    lines = str(caught.value).splitlines()
    assert len(lines) == 1 and lines[0].startswith("cluster.yaml: cluster") and expected in lines[0], lines


def test_brokers_form_one_kraft_quorum_with_replicated_internal_topics() -> None:
    spec = _spec(_tree())
    layout = RunLayout.create(spec)
    brokers = [plan_node(spec, layout, f"kafka-{i}").broker for i in (1, 2, 3)]
    assert [b.node_id for b in brokers] == [1, 2, 3]
    assert {b.cluster_id for b in brokers} == {cluster_id_for("cluster-demo")}
    props = cluster_properties(brokers[1])
    assert props["controller.quorum.voters"] == "1@10.0.0.1:9093,2@10.0.0.2:9093,3@10.0.0.3:9093"
    assert props["advertised.listeners"] == "PLAINTEXT://10.0.0.2:9092"
    assert props["offsets.topic.replication.factor"] == "3"
    assert props["transaction.state.log.min.isr"] == "2"


def test_cluster_ids_are_deterministic_kraft_ids() -> None:
    ids = {cluster_id_for(f"run-{i}") for i in range(200)}
    assert len(ids) == 200
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)
    assert cluster_id_for("run-1") == cluster_id_for("run-1")


def test_a_rollout_worker_uses_its_own_hosts_gateway_and_server_and_shares_the_task_group() -> None:
    spec = _spec(_tree())
    layout = RunLayout.create(spec)
    sections = {h: plan_node(spec, layout, h).files["rollout.yaml"] for h in ("roll-1", "roll-2")}
    assert sections["roll-2"]["inference"]["url"] == "http://10.0.0.12:30010"
    # its own gateway first, the other host's behind it (used while its own is down or full)
    sandbox = sections["roll-2"]["sandbox"]
    assert sandbox["urls"] == ["http://10.0.0.12:8710", "http://10.0.0.11:8710"] and "url" not in sandbox
    assert sandbox["preferred"] == ["http://10.0.0.12:8710"]
    assert sections["roll-1"]["sandbox"]["preferred"] == ["http://10.0.0.11:8710"]
    assert SandboxConfig(**sandbox).gateway_urls()[0] == "http://10.0.0.12:8710"
    groups = {s["data"]["consumer_group"] for s in sections.values()}
    topics = {s["data"]["topic"] for s in sections.values()}
    assert groups == {"stacx-rollout-cluster-demo"} and topics == {"stacx.tasks.cluster-demo"}
    # but a weights follower group each: the weights topic's one partition goes to one member only
    followers = [s["kafka"]["weights_group"] for s in sections.values()]
    assert followers == [f"stacx-rollout-weights-cluster-demo-{h}" for h in ("roll-1", "roll-2")]
    gateway = plan_node(spec, layout, "roll-2").files["gateway.yaml"]["gateway"]
    assert gateway["host"] == "10.0.0.12"


def test_a_rollout_host_without_a_server_uses_the_first_server_host() -> None:
    tree = _tree()
    tree["cluster"]["hosts"][4]["roles"] = ["rollout"]
    spec = _spec(tree)
    section = plan_node(spec, RunLayout.create(spec), "roll-2").files["rollout.yaml"]
    assert section["inference"]["url"] == "http://10.0.0.11:30010"


def test_trainer_ranks_over_two_hosts_join_one_c10d_rendezvous() -> None:
    spec = _spec(_tree())
    layout = RunLayout.create(spec)
    plans = {h: plan_node(spec, layout, h) for h in ("train-1", "train-2")}
    assert plans["train-1"].trainer_ranks == (0, 1) and plans["train-2"].trainer_ranks == (1, 1)
    for name, node in plans.items():
        (trainer,) = [s for s in service_specs(node, spec.cluster, Path("/cfg")) if s.name == "trainer"]
        assert trainer.program is not None and trainer.program[1:] == ["-m", "torch.distributed.run"]
        assert "--nnodes=2" in trainer.args and "--rdzv-backend=c10d" in trainer.args
        assert "--rdzv-endpoint=10.0.0.21:29400" in trainer.args
        assert f"--rdzv-conf=is_host={int(name == 'train-1')}" in trainer.args
        assert trainer.env["GLOO_SOCKET_IFNAME"] == "eth0" and trainer.finishes
        backend = node.files["trainer.yaml"]["backend"]
        assert (backend["kind"], backend["world_size"]) == ("fsdp2", 2)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stacx.infra.cli", *args],
        cwd=REPO, capture_output=True, text=True, timeout=300
    )


def test_node_up_explain_prints_the_hosts_plan_and_an_unknown_host_is_one_line() -> None:
    done = _cli("node", "up", "--cluster", str(CLUSTER_FILE), "--host", "roll-1", "--explain")
    assert done.returncode == 0, done.stderr
    plan = yaml.safe_load(done.stdout)
    assert [s["name"] for s in plan["services"]] == ["gateway", "inference", "rollout"]
    bad = _cli("node", "up", "--cluster", str(CLUSTER_FILE), "--host", "roll-9", "--explain")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines() == [
        f"stacx node up: {CLUSTER_FILE}: --host roll-9: no host 'roll-9' in cluster.hosts; hosts: "
        "kafka-1, kafka-2, kafka-3, roll-1, roll-2, train-1, train-2"
    ]


def test_stacx_run_refuses_a_file_of_many_hosts_naming_node_up() -> None:
    done = _cli("run", str(CLUSTER_FILE), "--explain")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "start each with `stacx node up --cluster" in done.stderr


def test_node_hosts_maps_a_slurm_node_index_to_a_host_name() -> None:
    assert _cli("node", "hosts", "--cluster", str(CLUSTER_FILE), "--index", "3").stdout == "roll-1\n"
    bad = _cli("node", "hosts", "--cluster", str(CLUSTER_FILE), "--index", "7")
    assert bad.returncode == 2 and "has 7 hosts" in bad.stderr


def test_the_sbatch_example_is_valid_bash() -> None:
    done = subprocess.run(
        ["bash", "-n", str(REPO / "examples" / "cluster" / "sbatch.sh")], capture_output=True
    )
    assert done.returncode == 0, done.stderr


def test_the_systemd_unit_template_verifies(tmp_path: Path) -> None:
    """The template as shipped, with this checkout's paths and user: no unknown key, no bad value
    (`systemd-analyze` is installed by `stacx infra up`: infra/services/tools.py)."""
    import getpass

    assert shutil.which("systemd-analyze"), "systemd-analyze is missing: run `stacx infra up`"

    text = (REPO / "examples" / "cluster" / "stacx-node@.service").read_text()
    stacx = Path(sys.executable).with_name("stacx")
    text = text.replace("/opt/stacx/.venv/bin/stacx", str(stacx)).replace("/opt/stacx", str(REPO))
    text = text.replace("User=stacx", f"User={getpass.getuser()}")
    unit = tmp_path / "stacx-node@roll-1.service"
    unit.write_text(text)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and unit.name not in done.stderr, done.stderr
    assert "--host %i" in text


def test_producers_wait_for_every_in_sync_replica() -> None:
    from stacx.producers.event_producer import EventProducer

    config = EventProducer.Config(bootstrap_servers="10.0.0.1:9092")
    settings = EventProducer._librdkafka_config(config)
    assert settings["acks"] == "all" and settings["enable.idempotence"] is True


@pytest.mark.parametrize(
    ("steps", "skill_steps", "export"), [(60, 54, "sft/v00000006"), (40, 40, "sft-skill/v00000040")]
)
def test_every_host_starts_from_the_directory_the_sft_warm_start_exports(
    steps: int, skill_steps: int, export: str
) -> None:
    """The hosts other than the set-up host never see the SFT run: they plan its export's path,
    which must be the directory the trainer's export writes (trainer/engine.py: `v{step:08d}`)."""
    tree = _tree()
    tree["pipeline"]["sft"].update(steps=steps, skill_steps=skill_steps)
    spec = _spec(tree)
    layout = RunLayout.create(spec)
    trainer = plan_node(spec, layout, "train-2").files["trainer.yaml"]
    rollout = plan_node(spec, layout, "roll-1").files["rollout.yaml"]
    expected = layout.sft_root / export
    assert Path(trainer["models"]["policy"]["path"]) == expected
    assert Path(rollout["inference"]["tokenizer"]) == expected.resolve()


def test_node_bind_puts_host_i_on_allocated_node_i_with_absolute_plugin_paths(tmp_path: Path) -> None:
    """The job's copy of the file (sbatch.sh): addresses from the allocation, plug-ins found from
    any folder; a wrong node count or pair is one line."""
    pairs = [f"n{i}=10.9.0.{i}" for i in range(1, 8)]
    out = tmp_path / "job.yaml"
    done = _cli("node", "bind", "--cluster", str(CLUSTER_FILE), "--out", str(out), *pairs)
    assert done.returncode == 0, done.stderr
    bound = yaml.safe_load(out.read_text())
    assert [h["address"] for h in bound["cluster"]["hosts"]] == [f"10.9.0.{i}" for i in range(1, 8)]
    assert bound["pipeline"]["plugin_paths"] == [str(REPO / "examples")]
    assert done.stdout.splitlines()[3] == "roll-1\tn4\t10.9.0.4"
    short = _cli("node", "bind", "--cluster", str(CLUSTER_FILE), "--out", str(out), *pairs[:2])
    assert short.returncode == 2 and "Traceback" not in short.stderr
    assert "allocate as many nodes as hosts (sbatch --nodes=7)" in short.stderr
    bad = _cli("node", "bind", "--cluster", str(CLUSTER_FILE), "--out", str(out), "n1")
    assert bad.returncode == 2 and "give each allocated node as NODE=ADDRESS" in bad.stderr
