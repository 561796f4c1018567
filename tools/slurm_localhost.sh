#!/usr/bin/env bash
# A one-node SLURM on this machine, for tests/devices/test_cluster.py's srun test (and for trying sbatch/srun
# launches by hand): Debian's/Ubuntu's slurm-wlm and munge, one partition "debug" holding this host, daemons
# started without systemd (containers have none). Needs root. Run it again to restart the daemons.
#
#   sudo apt-get install -y slurm-wlm munge     # once
#   sudo tools/slurm_localhost.sh
#   srun -n 2 hostname
set -euo pipefail

if [[ $EUID -ne 0 ]]; then
  echo "error: run as root (sudo tools/slurm_localhost.sh): it writes /etc/slurm and starts daemons" >&2
  exit 1
fi
for tool in slurmctld slurmd munged srun sinfo; do
  if ! command -v "$tool" >/dev/null; then
    echo "error: $tool not found: install SLURM first (apt-get install -y slurm-wlm munge)" >&2
    exit 1
  fi
done

host=$(hostname -s)
cpus=$(nproc)
memory_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)

# munge: the key every SLURM daemon and client authenticates with
mkdir -p /etc/munge /var/log/munge /var/lib/munge /run/munge
if [[ ! -s /etc/munge/munge.key ]]; then
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown -R munge:munge /etc/munge /var/log/munge /var/lib/munge /run/munge
chmod 0700 /etc/munge /var/log/munge /var/lib/munge
chmod 0400 /etc/munge/munge.key
chmod 0755 /run/munge
if ! pgrep -x munged >/dev/null; then
  runuser -u munge -- munged
fi

mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
cat > /etc/slurm/slurm.conf <<EOF
ClusterName=localhost
SlurmctldHost=${host}
SlurmUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
KillWait=30
NodeName=${host} CPUs=${cpus} RealMemory=${memory_mb} State=UNKNOWN
PartitionName=debug Nodes=${host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF

for daemon in slurmctld slurmd; do
  if [[ -f /run/${daemon}.pid ]] && kill -0 "$(cat /run/${daemon}.pid)" 2>/dev/null; then
    kill "$(cat /run/${daemon}.pid)"
    sleep 1
  fi
done
slurmctld
slurmd

for _ in $(seq 30); do
  if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
    echo "SLURM is up: partition debug on ${host} (${cpus} CPUs); try: srun -n 2 hostname"
    exit 0
  fi
  sleep 1
done
echo "error: the node did not come up; see /var/log/slurm/slurmctld.log and /var/log/slurm/slurmd.log" >&2
exit 1
