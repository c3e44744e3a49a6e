#!/usr/bin/env bash
# Shape the lab's links from the host: a token-bucket filter (tc tbf) on eth0 of
# every running container of a compose project, with netem under it for a delay.
# tc runs in each container's network namespace through nsenter, so the images
# keep no capabilities (no NET_ADMIN). tbf shapes what a container SENDS, so every
# container is shaped: each of them then sends and receives at most RATE.
#
# Usage (as root; the Makefile calls it: make up LINK=1gbit LINK_DELAY=1ms):
#   compose/shape-links.sh check RATE [DELAY]          only check the values and the host (tc, nsenter, root)
#   compose/shape-links.sh apply PROJECT RATE [DELAY]  shape every running container of PROJECT
#   compose/shape-links.sh clear PROJECT               remove the shaping (eth0 back to Docker's default)
#   compose/shape-links.sh show PROJECT                each container's eth0 qdiscs (unshaped: noqueue)
#   compose/shape-links.sh follow PROJECT SERVICE PID  while PID lives, shape each new SERVICE container
#                                                      as the master is shaped (make submit's driver)
# RATE is a tc rate with its unit (100mbit, 1gbit, 500kbit, 12mbps); empty with a
# DELAY for a delay alone. DELAY is a tc time (1ms, 500us). A container Docker
# restarts comes back unshaped: apply again (make up LINK=...).
set -euo pipefail

DEV=eth0
BURST=128kb       # a few packets above rate/HZ up to 1gbit; the issue's measurements used it
LATENCY=200ms     # how long a packet may wait in the bucket before tbf drops it

die() { echo "shape-links: $*" >&2; exit "${code:-1}"; }
usage() { sed -n '8,17p' "$0" | sed 's/^# //' >&2; code=2 die "$1"; }

check_rate() {
    local unit='([kmgt]i?)?(bit|bps)'
    [[ "${1,,}" =~ ^[0-9]+(\.[0-9]+)?$unit$ ]] || code=2 die "bad rate '$1': expected a number and a tc unit," \
        "e.g. 100mbit, 1gbit, 500kbit or 12mbps (bit: bits/s, bps: bytes/s)"
}

check_delay() {
    [[ "${1,,}" =~ ^[0-9]+(\.[0-9]+)?(s|sec|ms|msec|us|usec)$ ]] || code=2 die "bad delay '$1': expected a" \
        "number and a unit, e.g. 1ms, 0.5ms or 200us"
}

check_host() {
    command -v tc >/dev/null || die "tc is missing on this host: apt-get install iproute2"
    command -v nsenter >/dev/null || die "nsenter is missing on this host: apt-get install util-linux"
    [ "$(id -u)" -eq 0 ] || die "shaping enters the containers' network namespaces and needs root;" \
        "received uid $(id -u): run it with sudo (sudo make up LINK=...)"
    command -v docker >/dev/null || die "the docker CLI is missing: run .ci/install-docker.sh"
}

# Running containers of the project (one service with $2), one "ID NAME" a line.
containers() {
    local filters=(--filter "label=com.docker.compose.project=$1")
    [ -z "${2:-}" ] || filters+=(--filter "label=com.docker.compose.service=$2")
    docker ps "${filters[@]}" --format '{{.ID}} {{.Names}}'
}

in_netns() {  # CONTAINER COMMAND...: run COMMAND in the container's network namespace
    local pid
    pid=$(docker inspect -f '{{.State.Pid}}' "$1")
    [ "$pid" -gt 0 ] || die "container $1 is not running"
    shift
    nsenter -t "$pid" -n "$@"
}

qdiscs() { in_netns "$1" tc qdisc show dev "$DEV"; }

unshape() {  # the root qdisc back to the veth's default; nothing to do when none of ours is there
    if qdiscs "$1" | grep -qE '^qdisc (tbf|netem) '; then in_netns "$1" tc qdisc del dev "$DEV" root; fi
}

shape() {  # CONTAINER RATE DELAY; every step checked (callers may run it where set -e does not hold)
    unshape "$1" || return 1  # a fresh tree: `replace` would keep an earlier netem under a new tbf
    if [ -z "$2" ]; then
        in_netns "$1" tc qdisc replace dev "$DEV" root handle 10: netem delay "$3"
        return
    fi
    in_netns "$1" tc qdisc replace dev "$DEV" root handle 1: tbf rate "$2" burst "$BURST" latency "$LATENCY" || return 1
    [ -z "$3" ] || in_netns "$1" tc qdisc replace dev "$DEV" parent 1:1 handle 10: netem delay "$3"
}

# "RATE DELAY" of a shaped container, read back from tc (tc accepts the units it prints); "" when unshaped.
settings_of() {
    qdiscs "$1" | awk '
        $2 == "tbf"   { for (i = 3; i < NF; i++) if ($i == "rate")  rate = $(i + 1) }
        $2 == "netem" { for (i = 3; i < NF; i++) if ($i == "delay") delay = $(i + 1) }
        END { if (rate != "" || delay != "") print (rate == "" ? "-" : rate), (delay == "" ? "-" : delay) }'
}

cmd="${1:-}"
case "$cmd" in
    check)
        [ $# -ge 2 ] && [ $# -le 3 ] || usage "check takes RATE [DELAY]; received: ${*:2}"
        [ -n "$2${3:-}" ] || usage "check needs a RATE, a DELAY or both"
        [ -z "$2" ] || check_rate "$2"
        [ -z "${3:-}" ] || check_delay "$3"
        check_host
        ;;
    apply)
        [ $# -ge 3 ] && [ $# -le 4 ] || usage "apply takes PROJECT RATE [DELAY]; received: ${*:2}"
        project=$2 rate=$3 delay=${4:-}
        [ -n "$rate$delay" ] || usage "apply needs a RATE, a DELAY or both"
        [ -z "$rate" ] || check_rate "$rate"
        [ -z "$delay" ] || check_delay "$delay"
        check_host
        list=$(containers "$project")
        [ -n "$list" ] || die "no running container of the compose project '$project': make up first"
        while read -r id name; do
            if ! err=$( (shape "$id" "$rate" "$delay") 2>&1); then
                while read -r other _; do (unshape "$other") || true; done <<<"$list"
                hint=
                if [[ "$err" == *"qdisc kind is unknown"* ]] && [ -n "$delay" ]; then
                    hint=" This kernel lacks netem (CONFIG_NET_SCH_NETEM; try modprobe sch_netem), which a delay"
                    hint+=" needs: drop LINK_DELAY, or use a kernel with it."
                fi
                die "shaping $name failed: ${err//$'\n'/ }; every link of $project left unshaped.$hint"
            fi
            read -r r d <<<"$(settings_of "$id")"
            echo "  $name: rate ${r/#-/unlimited}, delay ${d/#-/none}"
        done <<<"$list"
        echo "shaped $(wc -l <<<"$list") container(s) of $project: rate ${rate:-unlimited}, delay ${delay:-none}"
        ;;
    clear)
        [ $# -eq 2 ] || usage "clear takes PROJECT; received: ${*:2}"
        check_host
        containers "$2" | while read -r id name; do unshape "$id"; done
        ;;
    show)
        [ $# -eq 2 ] || usage "show takes PROJECT; received: ${*:2}"
        check_host
        containers "$2" | while read -r id name; do echo "$name: $(qdiscs "$id" | tr '\n' ';' | sed 's/;$//')"; done
        ;;
    follow)
        [ $# -eq 4 ] || usage "follow takes PROJECT SERVICE PID; received: ${*:2}"
        project=$2 service=$3 parent=$4
        check_host
        master=$(containers "$project" master | awk 'NR == 1 {print $1}')
        [ -n "$master" ] || exit 0
        read -r rate delay <<<"$(settings_of "$master")"
        [ -n "${rate:-}" ] || exit 0  # the lab is unshaped: nothing to follow
        [ "$rate" != - ] || rate=
        [ "$delay" != - ] || delay=
        done_ids=" "
        # A few tenths of a second after its start, before the driver's JVM and Python are up.
        while kill -0 "$parent" 2>/dev/null; do
            while read -r id name; do
                [ -n "$id" ] && [[ "$done_ids" != *" $id "* ]] || continue
                if (shape "$id" "$rate" "$delay") 2>/dev/null; then  # not started yet: next round
                    done_ids+="$id "
                    echo "shaped the $service container $name like the lab:" \
                        "rate ${rate:-unlimited}, delay ${delay:-none}" >&2
                fi
            done <<<"$(containers "$project" "$service")"
            sleep 0.2
        done
        ;;
    *)
        usage "expected check, apply, clear, show or follow; received '${cmd}'"
        ;;
esac
