#!/usr/bin/env bash
# Two "hosts" on this machine for multi-host tests: network namespaces PREFIX-h1 and PREFIX-h2
# joined by a veth pair (PREFIX-h1: 10.213.77.1/30 on veth dsp0, PREFIX-h2: 10.213.77.2/30 on
# veth dsp0). Nothing outside the two namespaces is given an address or a route, so the
# traffic of a job launched across them stays on that one link.
#
#   scripts/netns-hosts.sh up   [PREFIX]   create (replacing leftovers of an earlier run)
#   scripts/netns-hosts.sh down [PREFIX]   delete both namespaces (and with them the veth pair)
#   scripts/netns-hosts.sh link-down|link-up [PREFIX]   take the link down / up again
#   scripts/netns-hosts.sh hostfile [PREFIX]  print an OpenMPI hostfile for the two hosts
#
# PREFIX defaults to "dsp". Needs root and iproute2 (`ip netns`). Jobs are launched with
# OpenMPI's rsh launcher pointed at scripts/netns-rsh.sh (see docs/cluster.md):
#
#   ip netns exec dsp-h1 mpirun --hostfile H -n 2 --mca plm_rsh_agent scripts/netns-rsh.sh \
#       --mca btl tcp,self --mca btl_tcp_if_include 10.213.77.0/30 \
#       --mca oob_tcp_if_include 10.213.77.0/30 --mca oob_tcp_keepalive_time 2 \
#       --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 3 \
#       distspmm train --chunks DIR
set -euo pipefail

cmd="${1:-}"
prefix="${2:-dsp}"
h1="$prefix-h1"
h2="$prefix-h2"
subnet="10.213.77"
veth="dsp0"

down() {
    ip netns del "$h1" 2>/dev/null || true
    ip netns del "$h2" 2>/dev/null || true
}

case "$cmd" in
up)
    command -v ip >/dev/null || { echo "netns-hosts: iproute2 (ip) is not installed" >&2; exit 2; }
    down
    ip netns add "$h1"
    ip netns add "$h2"
    # Create both ends directly inside their namespaces: no name is ever taken in the root one.
    ip link add "$veth" netns "$h1" type veth peer name "$veth" netns "$h2"
    ip -n "$h1" addr add "$subnet.1/30" dev "$veth"
    ip -n "$h2" addr add "$subnet.2/30" dev "$veth"
    for ns in "$h1" "$h2"; do
        ip -n "$ns" link set lo up
        ip -n "$ns" link set "$veth" up
    done
    # Wait for the carrier on both ends (a veth pair comes up within milliseconds).
    for _ in $(seq 1 50); do
        if ip -n "$h1" -o link show "$veth" | grep -q LOWER_UP &&
            ip -n "$h2" -o link show "$veth" | grep -q LOWER_UP; then
            exit 0
        fi
        sleep 0.1
    done
    echo "netns-hosts: the veth pair $h1/$veth - $h2/$veth did not come up" >&2
    exit 1
    ;;
down)
    down
    ;;
link-down)
    ip -n "$h1" link set "$veth" down
    ;;
link-up)
    ip -n "$h1" link set "$veth" up
    ;;
hostfile)
    printf '%s.1 slots=1\n%s.2 slots=1\n' "$subnet" "$subnet"
    ;;
*)
    sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
