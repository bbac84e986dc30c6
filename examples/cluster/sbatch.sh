#!/bin/bash
# Slurm: one `stacx node up` per allocated node, each with the cluster.yaml host of the same
# index (SLURM_NODEID) as its name. cluster.yaml lists the hosts in the allocation's order.
#   sbatch --nodes=7 examples/cluster/sbatch.sh /shared/cluster.yaml
#SBATCH --job-name=stacx
#SBATCH --ntasks-per-node=1
#SBATCH --time=04:00:00
#SBATCH --output=stacx-%j-%N.log
set -euo pipefail

CLUSTER=${1:?usage: sbatch --nodes=N sbatch.sh CLUSTER.yaml}
STACX=${STACX:-/opt/stacx/.venv/bin/stacx}

# srun forwards SIGTERM (scancel, the time limit) to every `stacx node up`, which stops its services
srun --kill-on-bad-exit=0 bash -c '
  host=$("'"$STACX"'" node hosts --cluster "'"$CLUSTER"'" --index "$SLURM_NODEID")
  exec "'"$STACX"'" node up --cluster "'"$CLUSTER"'" --host "$host"
'
