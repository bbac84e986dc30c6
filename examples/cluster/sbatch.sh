#!/bin/bash
# Slurm: one `stacx node up` per allocated node. The allocation's nodes (`scontrol show hostnames`,
# in order) take CLUSTER.yaml's hosts in order: `stacx node bind` writes the job's copy of the file
# with each host's address set to its node's (NodeAddr) and plugin paths made absolute. Each node
# runs one job step; the job ends when the trainer hosts' steps end (training reached
# pipeline.steps), then the other nodes are stopped (SIGTERM: each node stops its services).
#   sbatch --nodes=7 examples/cluster/sbatch.sh examples/cluster/cluster.yaml
# Resources are asked per node: override on the command line, e.g. --cpus-per-task=32 --mem=128G
# --gres=gpu:4 (the `resources:` section then places trainer ranks and servers on those GPUs).
# A node that fails ends its own step, not the job (--no-kill): brokers, rollout hosts and
# gateways are redundant; a lost trainer host ends training with an error (the job fails and,
# with --requeue, Slurm runs it again: the trainer resumes from its checkpoint, the topics and
# the run's files are kept).
#SBATCH --job-name=stacx
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=8
#SBATCH --mem=32G
#SBATCH --time=04:00:00
#SBATCH --output=stacx-%j.log
#SBATCH --no-kill
#SBATCH --requeue
set -euo pipefail

CLUSTER=${1:?usage: sbatch --nodes=N sbatch.sh CLUSTER.yaml}
STACX=${STACX:-/opt/stacx/.venv/bin/stacx}
JOB_FILE=${STACX_JOB_FILE:-$PWD/stacx-cluster-$SLURM_JOB_ID.yaml}

mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
PAIRS=()
for node in "${NODES[@]}"; do
  address=$(scontrol show node "$node" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)
  PAIRS+=("$node=${address:-$node}")
done
"$STACX" node bind --cluster "$CLUSTER" --out "$JOB_FILE" "${PAIRS[@]}"

TRAINERS=()
OTHERS=()
i=0
while IFS=$'\t' read -r host _address roles; do
  srun --nodes=1 --ntasks=1 --nodelist="${NODES[$i]}" --kill-on-bad-exit=0 \
    "$STACX" node up --cluster "$JOB_FILE" --host "$host" &
  if [[ ",$roles," == *",trainer,"* ]]; then TRAINERS+=($!); else OTHERS+=($!); fi
  i=$((i + 1))
done < <("$STACX" node hosts --cluster "$JOB_FILE")

# SIGTERM to every node's task (not to srun: a signalled srun kills its step with SIGKILL);
# each `stacx node up` then stops its services
stop_all() {
  scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null || true
  wait || true
}
trap 'stop_all; exit 143' TERM INT

status=0
for pid in "${TRAINERS[@]}"; do
  wait "$pid" || status=$?
done
echo "stacx: training ended (status $status); stopping the other nodes"
scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null || true
for pid in "${OTHERS[@]}"; do
  wait "$pid" || true
done
exit "$status"
