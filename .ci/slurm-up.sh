#!/usr/bin/env bash
# Starts a single-node Slurm cluster on this machine (Debian, as root): munged, slurmctld and slurmd, each in the
# foreground of its own background process, from a minimal slurm.conf (one node = this host, one partition
# "debug"; proctrack/linuxproc and task/none, so no cgroups or systemd are needed). Installs slurm-wlm and munge
# with apt-get when they are missing. Idempotent: when `sinfo` already shows a usable node it does nothing.
#
# Exit status 0 once `sinfo` shows the node idle; non-zero with the reason (and the daemons' log tails) otherwise.
# Logs: $SLURM_LOG_DIR (default /var/log/slurm). A slurm.conf not written by this script is used as it is.
set -uo pipefail

HOST="$(hostname -s)"
CONF="${SLURM_CONF:-/etc/slurm/slurm.conf}"
LOG_DIR="${SLURM_LOG_DIR:-/var/log/slurm}"
WAIT_S="${SLURM_UP_WAIT_S:-60}"
MARK="# written by attnlip .ci/slurm-up.sh"

say() { echo "slurm-up: $*" >&2; }
die() { say "$*"; exit 1; }
node_state() { timeout 10 sinfo -h -N -n "$HOST" -o '%T' 2>/dev/null | head -n1; }
node_usable() { case "$(node_state)" in idle|mixed|allocated|completing) return 0;; *) return 1;; esac; }

if command -v sinfo >/dev/null && node_usable; then
    say "already up: node $HOST is $(node_state)"
    exit 0
fi
[ "$(id -u)" = 0 ] || die "needs root (installs packages, writes $CONF, starts daemons as root)"

# 1. Packages.
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    say "installing slurm-wlm and munge with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q slurm-wlm munge >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q slurm-wlm munge >/dev/null; } \
        || die "apt-get install slurm-wlm munge failed (no package mirror reachable?)"
fi

# 2. Munge: a key, then munged (as the munge user when it exists, which is what munged expects).
MUNGE_USER=root
id munge >/dev/null 2>&1 && MUNGE_USER=munge
mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null \
        || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null
fi
chown -R "$MUNGE_USER:" /etc/munge /run/munge /var/lib/munge /var/log/munge
chmod 0700 /etc/munge && chmod 0400 /etc/munge/munge.key && chmod 0755 /run/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    say "starting munged (as $MUNGE_USER)"
    if [ "$MUNGE_USER" = root ]; then munged --force; else runuser -u munge -- munged; fi \
        || die "munged did not start: $(tail -n 5 /var/log/munge/munged.log 2>/dev/null)"
    for _ in $(seq 20); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.5; done
    munge -n | unmunge >/dev/null 2>&1 || die "munge does not answer: $(tail -n 5 /var/log/munge/munged.log 2>/dev/null)"
fi

# 3. slurm.conf (only ours is rewritten; the node's memory and CPUs are read from this machine).
CPUS="$(nproc --all)"
MEM_MB="$(free -m | awk '/^Mem:/ {print $2}')"
MEM_MB=$(( MEM_MB * 95 / 100 ))  # below what slurmd detects, else the node is drained as "Low RealMemory"
mkdir -p "$(dirname "$CONF")" "$LOG_DIR" /var/spool/slurmctld /var/spool/slurmd /run/slurm
if [ ! -f "$CONF" ] || grep -qF "$MARK" "$CONF"; then
    cat > "$CONF" <<EOF
$MARK
ClusterName=attnlip
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=300
KillWait=5
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
    say "wrote $CONF (node $HOST: $CPUS CPUs, RealMemory=$MEM_MB MB)"
else
    say "using the existing $CONF (not written by this script)"
fi
export SLURM_CONF="$CONF"

# 4. Daemons, each in the foreground (-D) of a detached process, as root.
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
start() {  # name pidfile
    if alive "$2"; then return 0; fi
    say "starting $1"
    setsid nohup "$1" -D -f "$CONF" >>"$LOG_DIR/$1.stdout" 2>&1 < /dev/null &
    echo $! > "$2"
}
start slurmctld /run/slurm/slurmctld.pid
for _ in $(seq 20); do timeout 5 scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.5; done
start slurmd /run/slurm/slurmd.pid

# 5. Wait until the node is idle (a node left down/drained by an earlier run is resumed once).
resumed=0
for _ in $(seq $(( WAIT_S * 2 ))); do
    node_usable && { say "up: node $HOST is $(node_state)"; exit 0; }
    state="$(node_state)"
    if [ "$resumed" = 0 ] && [[ "$state" =~ ^(down|drain|drained|draining|fail) ]]; then
        scontrol update NodeName="$HOST" State=RESUME >/dev/null 2>&1 && resumed=1
    fi
    sleep 0.5
done
say "node $HOST did not become idle within ${WAIT_S}s (state: '$(node_state)'; reason: $(timeout 5 sinfo -h -R 2>/dev/null))"
for f in slurmctld slurmd; do
    say "--- $LOG_DIR/$f.log (tail)"; tail -n 15 "$LOG_DIR/$f.log" >&2 2>/dev/null
    tail -n 5 "$LOG_DIR/$f.stdout" >&2 2>/dev/null
done
exit 1
