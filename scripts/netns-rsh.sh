#!/bin/sh
# OpenMPI remote-shell agent for the namespace "hosts" of scripts/netns-hosts.sh: use it as
# `--mca plm_rsh_agent scripts/netns-rsh.sh`. OpenMPI calls it like ssh — `AGENT [OPTIONS] HOST
# COMMAND...` — to start its daemon (orted) on HOST; this runs COMMAND inside the network
# namespace that holds HOST's address, so the daemon and the ranks it starts talk over the veth
# link as on a real second machine.
#
# Like ssh, the command gets a fresh environment: only PATH, LD_LIBRARY_PATH and HOME are
# passed on (what a login shell on a machine with the same installation would have). Anything
# else the ranks need travels the way it must on a real cluster: `mpirun -x NAME`.
#
# NETNS_HOSTS_PREFIX (default "dsp") restricts the search to PREFIX-* namespaces, so two pairs
# of namespace hosts with the same addresses can exist at once.
set -eu

# Skip ssh-style options (OpenMPI passes none to an unknown agent, but be lenient).
while [ $# -gt 0 ]; do
    case "$1" in
    -*) shift ;;
    *) break ;;
    esac
done
[ $# -ge 2 ] || { echo "netns-rsh: usage: netns-rsh.sh HOST COMMAND..." >&2; exit 2; }
host="$1"
shift

prefix="${NETNS_HOSTS_PREFIX:-dsp}"
ns=""
for candidate in $(ip netns list | awk '{print $1}'); do
    case "$candidate" in "$prefix"-*) ;; *) continue ;; esac
    if ip -n "$candidate" -o -4 addr show | grep -q " inet $host/"; then
        ns="$candidate"
        break
    fi
done
if [ -z "$ns" ]; then
    echo "netns-rsh: no network namespace $prefix-* holds the address $host (run scripts/netns-hosts.sh up)" >&2
    exit 255
fi

# OpenMPI quotes the command for a remote shell, so a shell must read it, as sshd's would.
exec ip netns exec "$ns" env -i PATH="$PATH" LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}" \
    HOME="${HOME:-/}" /bin/sh -c "$*"
